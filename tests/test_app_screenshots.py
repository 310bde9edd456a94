"""Screenshots of the real window under Xvfb (skipped where there is no Xvfb, as in CI).

The test starts Xvfb and a window manager, then runs this file as a script on that display: it
opens a restored conversation with Markdown and code, three tabs streaming at once, the history,
the settings dialog, and a model that failed to load, saving a PNG of each in the test's tmp dir.
The conversation and the settings are taken again in the dark theme (View → Theme → Dark), and
the test compares each pair: the same layout, one light and one dark, both with readable text.
"""
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SHOTS = ["01-three-tabs-streaming", "02-finished-reply", "03-markdown-and-code", "04-settings", "05-load-failed"]
DARK = {"03-markdown-and-code": "07-markdown-and-code-dark", "04-settings": "08-settings-dark"}
DESKTOP = "06-desktop"  # the whole screen, window frame included (ImageMagick's import, if present)

RICH_REPLY = """Here is a small function that reverses the words of a sentence:

```python
def reverse_words(sentence: str) -> str:
    \"\"\"Return the words of `sentence` in reverse order.\"\"\"
    return " ".join(reversed(sentence.split()))
```

How it works:

1. `split()` cuts the sentence at runs of whitespace.
2. `reversed()` walks the list backwards, and **`join`** glues it back with single spaces.

For very long texts, a generator keeps memory flat. Run it with `python3 reverse.py`."""


def _conversation(cid: str, title: str, system_prompt: str = "") -> dict:
    return {"format_version": 1, "id": cid, "title": title, "created": "2025-06-02T09:12:00+00:00",
            "updated": "2025-06-02T09:13:00+00:00", "model": "SmolLM2-135M-Instruct", "settings": {},
            "system_prompt": system_prompt, "draft": "", "snapshot": None,
            "messages": [{"role": "user", "text": "Write a Python function that reverses the words in a sentence.",
                          "time": "2025-06-02T09:12:00+00:00", "tokens": None, "tok_s": None, "interrupted": False},
                         {"role": "assistant", "text": RICH_REPLY, "time": "2025-06-02T09:12:05+00:00",
                          "tokens": 142, "tok_s": 48.3, "interrupted": False}]}


def _seed_home(home: Path) -> None:
    folder = home / "data" / "conversations"
    folder.mkdir(parents=True)
    (folder / "rich.json").write_text(json.dumps(_conversation("rich", "Reverse the words", "Answer with code.")))
    for i, title in enumerate(["Packing list for a weekend hike", "What is a paged KV cache?",
                               "Dinner ideas with lentils"]):
        c = _conversation(f"old{i}", title)
        c["updated"] = f"2025-05-2{i}T10:00:00+00:00"
        (folder / f"old{i}.json").write_text(json.dumps(c))
    (home / "state").mkdir()
    (home / "state" / "session.json").write_text(json.dumps({"open_tabs": ["rich"], "active": 0}))


async def _scenario(out: Path, model: str) -> None:
    from PySide6.QtWidgets import QApplication

    from app import theme
    from app.app_settings import save_settings
    from app.main import create_window
    from app.settings_dialog import SettingsDialog
    from engine import EngineSettings, SamplingParams

    app = QApplication.instance()

    async def settle(seconds: float = 0.3) -> None:
        await asyncio.sleep(seconds)
        app.processEvents()

    def shot(widget, name: str) -> None:
        widget.grab().save(str(out / f"{name}.png"))

    save_settings(EngineSettings(model=model, backend="numpy", parallel=3, context=2048,
                                 sampling=SamplingParams(temperature=0.7, max_tokens=64)))
    window = create_window()
    window.resize(1280, 800)
    window.show()
    await window.start_engine()
    prompts = ["Give me three tips for writing clear emails.", "Explain what a hash map is, briefly.",
               "Suggest a name for a small bakery."]
    tabs = []
    for prompt in prompts:
        tab = window.new_tab()
        tab.composer.set_text(prompt)
        tab.composer.send_button.click()
        tabs.append(tab)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(len(t.conversation.messages[-1].text) > 60 for t in tabs):
        await settle(0.05)
    window.tabs.setCurrentWidget(tabs[1])
    await settle(0.2)
    shot(window, SHOTS[0])
    while any(t.generating for t in tabs):
        await settle(0.1)
    window.tabs.setCurrentWidget(tabs[0])
    await settle()
    shot(window, SHOTS[1])
    window.open_conversation("rich")
    await settle()
    shot(window, SHOTS[2])

    async def settings_shot(name: str) -> None:
        dialog = SettingsDialog(window.settings, busy=0, parent=window)
        dialog.show()
        await settle(0.5)
        shot(dialog, name)
        dialog.close()

    await settings_shot(SHOTS[3])
    window.menus.themes[theme.DARK].trigger()
    await settle()
    shot(window, DARK[SHOTS[2]])
    await settings_shot(DARK[SHOTS[3]])
    window.menus.themes[theme.SYSTEM].trigger()

    await window.apply_settings(EngineSettings(model=str(out / "missing-model.gguf"), backend="numpy"))
    window.current_tab().composer.set_text("Is anyone there?")
    window.current_tab().composer.send_button.click()
    await settle()
    shot(window, SHOTS[4])
    if shutil.which("import"):
        subprocess.run(["import", "-window", "root", str(out / f"{DESKTOP}.png")], check=False)
    window.close()


def _main(out: Path, model: str) -> None:
    import qasync
    from PySide6.QtWidgets import QApplication

    from app.main import configure

    app = QApplication(sys.argv[:1])
    configure(app)
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    with loop:
        loop.run_until_complete(_scenario(out, model))


@contextlib.contextmanager
def _x_server(tmp_path: Path):
    """An Xvfb display with a window manager (so windows get frames); yields its DISPLAY."""
    read_fd, write_fd = os.pipe()
    log = open(tmp_path / "xvfb.log", "w")
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(write_fd), "-screen", "0", "1440x900x24",
                             "-nolisten", "tcp", "-noreset"], pass_fds=(write_fd,), stdout=log, stderr=log)
    os.close(write_fd)
    number = b""
    while not number.endswith(b"\n"):  # Xvfb writes the number and the newline separately, and
        chunk = os.read(read_fd, 16)   # dies if the pipe closes in between
        if not chunk:
            break
        number += chunk
    os.close(read_fd)
    number = number.decode().strip()
    display = f":{number}"
    _wait_for_socket(f"/tmp/.X11-unix/X{number}")
    wm = subprocess.Popen(["openbox"], env=dict(os.environ, DISPLAY=display), stdout=log, stderr=log) \
        if shutil.which("openbox") else None
    time.sleep(0.5)  # let the window manager take the screen before the first window maps
    try:
        yield display
    finally:
        for proc in (wm, xvfb):
            if proc is not None:
                proc.terminate()
                proc.wait()
        log.close()


def _wait_for_socket(path: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket(socket.AF_UNIX) as sock:
            try:
                sock.connect(path)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.05)


@pytest.mark.skipif(shutil.which("Xvfb") is None, reason="no Xvfb here (CI runs Qt offscreen)")
def test_screenshots(tmp_path, app_model):
    from PySide6.QtGui import QImage

    from engine import default_model_path

    default = default_model_path()
    model = str(default) if default.is_file() else app_model  # real text reads better in a screenshot
    home = tmp_path / "home"
    _seed_home(home)
    repo = Path(__file__).resolve().parent.parent
    with _x_server(tmp_path) as display:
        env = dict(os.environ, DISPLAY=display, QT_QPA_PLATFORM="xcb", LANECHAT_HOME=str(home),
                   PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
        run = subprocess.run([sys.executable, __file__, str(tmp_path), model], env=env, cwd=repo,
                             capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:] + (tmp_path / "xvfb.log").read_text()[-2000:]
    for name in SHOTS + list(DARK.values()):
        image = QImage(str(tmp_path / f"{name}.png"))
        assert image.width() > 300 and image.height() > 200, name
        assert len({image.pixel(x, y) for x in range(0, image.width(), 37) for y in range(0, image.height(), 37)}) > 3
    for light_name, dark_name in DARK.items():
        light, dark = QImage(str(tmp_path / f"{light_name}.png")), QImage(str(tmp_path / f"{dark_name}.png"))
        assert light.size() == dark.size(), dark_name  # a theme changes colours, not the layout
        light_tones, dark_tones = _lightness(light), _lightness(dark)
        assert _median(light_tones) > 0.8 and _median(dark_tones) < 0.25, (dark_name, _median(dark_tones))
        # Text on either: one sample in a hundred or more far from the background's tone.
        for tones in (light_tones, dark_tones):
            background = _median(tones)
            assert sum(abs(t - background) > 0.4 for t in tones) > 0.01 * len(tones), dark_name
    print("screenshots in", tmp_path)


def _lightness(image) -> list[float]:
    """Lightness (0..1) of a grid of pixels, every 3rd in each direction."""
    from PySide6.QtGui import QColor
    return [QColor(image.pixel(x, y)).lightnessF() for x in range(0, image.width(), 3)
            for y in range(0, image.height(), 3)]


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


if __name__ == "__main__":
    _main(Path(sys.argv[1]), sys.argv[2])
