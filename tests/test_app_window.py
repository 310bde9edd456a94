"""The window end to end on the numpy backend: parallel tabs, stop, settings, quit and relaunch,
bad files, load failures, per-tab errors, history. Qt offscreen; the real engine."""
import json
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.app_settings import load_settings, save_settings
from app.conversation import FORMAT_VERSION
from app.main import create_window
from app.reply import WAITING
from engine import EngineSettings, SamplingParams


def settings_for(model: str, **kw) -> EngineSettings:
    sampling = SamplingParams(temperature=0, max_tokens=kw.pop("max_tokens", 48), ignore_eos=True)
    return EngineSettings(model=model, backend="numpy", parallel=kw.pop("parallel", 2),
                          context=kw.pop("context", 512),
                          sampling=sampling, **kw)


@pytest.fixture
def launch(qtbot, run_async, app_home, app_model):
    """launch(**settings) -> a shown window of the saved session with its engine started."""
    windows = []

    def start(start_engine=True, **kw):
        if kw or not windows:
            save_settings(settings_for(kw.pop("model", app_model), **kw))
        window = create_window()
        qtbot.addWidget(window)
        window.show()
        qtbot.waitExposed(window)
        window.activateWindow()
        windows.append(window)
        if start_engine:
            assert run_async(window.start_engine(), timeout=120)
        return window
    yield start
    for w in windows:
        w.close()


def send(qtbot, tab, text):
    tab.composer.set_text(text)
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return)


def conv_file(app_home, tab) -> dict:
    tab.saver.flush()  # writes while replies stream go through the saver's thread
    return json.loads((app_home / "data" / "conversations" / f"{tab.conversation.id}.json").read_text())


def click(qtbot, button):
    """A real mouse click on a button the user can see."""
    assert button.isVisible() and button.isEnabled(), button.text()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def test_two_tabs_stream_at_the_same_time(qtbot, launch):
    window = launch(max_tokens=300)
    a = window.current_tab()
    b = window.new_tab()
    assert window.tabs.count() == 2
    send(qtbot, a, "First question")
    send(qtbot, b, "Second question")
    seen = {a: [], b: []}  # (time, characters so far, still generating)

    def sample():
        for tab in (a, b):
            reply = tab.conversation.messages[-1]
            seen[tab].append((time.monotonic(), len(reply.text), tab.generating))
        return not a.generating and not b.generating
    qtbot.waitUntil(sample, timeout=60000)
    both_typing = [i for i, (sa, sb) in enumerate(zip(seen[a], seen[b]))
                   if sa[1] and sa[2] and sb[1] and sb[2]]
    assert both_typing, "the two replies never streamed at the same time"
    for tab in (a, b):
        reply = tab.conversation.messages[-1]
        assert reply.role == "assistant" and reply.tokens == 300 and not reply.interrupted and reply.tok_s
    assert a.title == "First question" and window.tabs.tabText(1) == "Second question"


def test_stop_keeps_the_text_so_far_as_interrupted(qtbot, launch, app_home):
    window = launch(max_tokens=100000)
    tab = window.current_tab()
    send(qtbot, tab, "Tell me everything")
    assert tab.composer.stop_button.isVisibleTo(tab) and not tab.composer.send_button.isVisibleTo(tab)
    qtbot.waitUntil(lambda: bool(tab.conversation.messages[-1].text), timeout=30000)
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not tab.generating, timeout=10000)
    reply = tab.conversation.messages[-1]
    assert reply.interrupted and reply.text and reply.tokens
    assert conv_file(app_home, tab)["messages"][-1]["interrupted"] is True
    assert tab.composer.send_button.isVisibleTo(tab)
    send(qtbot, tab, "And now?")  # the tab is usable again: stop by the button this time
    qtbot.waitUntil(lambda: len(tab.conversation.messages) == 4 and bool(tab.conversation.messages[-1].text),
                    timeout=30000)
    qtbot.mouseClick(tab.composer.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not tab.generating, timeout=10000)


def test_apply_settings_restarts_the_engine_keeps_tabs_and_persists(qtbot, launch, run_async, app_model):
    window = launch()
    tab = window.current_tab()
    send(qtbot, tab, "Before the restart")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    ids = [t.conversation.id for t in window.tabs.tabs()]
    new = settings_for(app_model, parallel=3, kv_dtype="fp8", paging="all", page_tokens=64)
    assert run_async(window.apply_settings(new), timeout=120)
    info = window.bridge.info
    assert info.parallel == 3 and "the engine's own and 2 more" in info.plan_line
    assert window.status.plan.toolTip() == info.plan_line and info.plan_line.startswith("plan:")
    assert window.status.plan.text().startswith("3 chats at once · 512 tokens each")
    assert [t.conversation.id for t in window.tabs.tabs()] == ids and len(tab.conversation.messages) == 2
    assert load_settings()[0] == new
    send(qtbot, tab, "After the restart")
    qtbot.waitUntil(lambda: not tab.generating and len(tab.conversation.messages) == 4, timeout=30000)
    assert tab.conversation.settings["kv_dtype"] == "fp8"


def test_quit_mid_answer_then_relaunch_restores_and_continues(qtbot, launch, app_home):
    window = launch(max_tokens=100000)
    first = window.current_tab()
    send(qtbot, first, "A question to keep")
    second = window.new_tab()
    second.system_edit.setPlainText("Be brief.")
    send(qtbot, second, "Another one")
    qtbot.waitUntil(lambda: bool(second.conversation.messages[-1].text), timeout=30000)
    second.composer.set_text("an unsent draft")
    window.tabs.setCurrentIndex(0)
    window.close()  # quit with both replies in progress
    saved = conv_file(app_home, second)
    assert saved["messages"][-1]["interrupted"] is True and saved["messages"][-1]["text"]
    assert saved["system_prompt"] == "Be brief." and saved["draft"] == "an unsent draft"
    assert saved["format_version"] == FORMAT_VERSION and saved["model"] and saved["settings"]["backend"] == "numpy"

    window = launch(max_tokens=8)
    tabs = window.tabs.tabs()
    assert [t.conversation.id for t in tabs] == [first.conversation.id, second.conversation.id]
    assert window.tabs.currentIndex() == 0
    again = tabs[1]
    assert again.composer.text() == "an unsent draft" and again.system_edit.toPlainText() == "Be brief."
    assert len(again.view.widgets) == 2 and again.conversation.messages[-1].interrupted
    sent = []
    submit = window.bridge.submit
    window.bridge.submit = lambda messages, sampling, sink, **kw: (sent.append(messages),
                                                                   submit(messages, sampling, sink, **kw))[1]
    send(qtbot, again, "Continue please")
    qtbot.waitUntil(lambda: not again.generating, timeout=30000)
    history = sent[0]
    assert [m["role"] for m in history] == ["system", "user", "assistant", "user"]
    assert history[1]["content"] == "Another one" and history[-1]["content"] == "Continue please"
    assert not again.conversation.messages[-1].interrupted


def test_corrupt_conversation_is_set_aside_with_a_notice(qtbot, launch, app_home):
    folder = app_home / "data" / "conversations"
    folder.mkdir(parents=True)
    (folder / "broken.json").write_text('{"format_version": 1, "messa')
    good = {"format_version": 1, "id": "good", "title": "Still here", "created": "2025-01-01T00:00:00+00:00",
            "updated": "2025-01-01T00:00:00+00:00", "messages": [{"role": "user", "text": "hi"}]}
    (folder / "good.json").write_text(json.dumps(good))
    window = launch(start_engine=False)
    assert any("broken.json" in n.text for n in window.notices.notices())
    assert (folder / "set-aside" / "broken.json").exists()
    assert window.history.ids() == ["good"]
    window.open_conversation("good")
    assert window.current_tab().title == "Still here"
    assert window.tabs.count() == 1  # the blank tab was replaced, not kept beside it


def test_bad_files_in_the_open_tab_session_never_stop_the_start(qtbot, launch, app_home):
    folder = app_home / "data" / "conversations"
    folder.mkdir(parents=True)
    base = {"format_version": 1, "id": "x", "title": "Typed", "created": "2025-01-01T00:00:00+00:00",
            "messages": [{"role": "user", "text": "hi"}]}
    files = {"deep": "[" * 100_000 + "]" * 100_000,
             "types": json.dumps({**base, "created": [1], "updated": "0001-01-01T00:00:00+14:00", "messages": [
                 {"role": "user", "text": "hi", "time": "9999-12-31T23:59:59-14:00"},
                 {"role": "assistant", "text": "a\ud800b", "error": 5, "tok_s": "fast", "tokens": "x"}]}),
             "surrogate": json.dumps({**base, "title": "\udcff"})}
    for name, text in files.items():
        (folder / f"{name}.json").write_text(text, encoding="utf-8", errors="surrogatepass")
    (app_home / "state").mkdir(parents=True)
    (app_home / "state" / "session.json").write_text(json.dumps(
        {"open_tabs": ["deep", "types", "surrogate", 5], "active": "first", "geometry": 7, "sidebar": "yes"}))
    window = launch(start_engine=False)
    assert [t.conversation.id for t in window.tabs.tabs()] == ["types", "surrogate"]
    assert any("deep.json" in n.text and "nested more than" in n.text for n in window.notices.notices())
    typed = window.tabs.tabs()[0].conversation
    assert typed.created == "" and typed.messages[1].error is None and typed.messages[1].tok_s is None
    window.close()
    assert "\\ud800" in (folder / "types.json").read_text()  # saved again on quit, the surrogate escaped


def test_a_model_that_fails_to_load_leaves_the_app_usable(qtbot, launch, run_async, app_home, app_model):
    window = launch(start_engine=False, model=str(app_home / "no-such-model"))
    assert not run_async(window.start_engine(), timeout=60)
    assert window.bridge.state == "failed"
    notice = [n for n in window.notices.notices() if "could not be loaded" in n.text]
    assert notice and "no-such-model" in notice[0].text
    assert window.status.error.isVisibleTo(window) and window.status.fix.isVisibleTo(window)
    tab = window.current_tab()
    send(qtbot, tab, "Anyone there?")
    assert tab.conversation.messages[-1].error.startswith("No model is loaded")
    assert not tab.generating
    assert run_async(window.apply_settings(settings_for(app_model)), timeout=120)
    assert not [n for n in window.notices.notices() if "could not be loaded" in n.text]
    retry = tab.view.widgets[-1]._regenerate
    assert retry.text() == "Retry"
    click(qtbot, retry)  # retry the failed reply
    assert tab.generating
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    assert tab.conversation.messages[-1].text and not tab.conversation.messages[-1].error


def test_an_error_in_one_tab_leaves_the_other_generating(qtbot, launch):
    window = launch(max_tokens=200)
    good, bad = window.current_tab(), window.new_tab()
    send(qtbot, good, "A normal question")
    send(qtbot, bad, "word " * 2000)  # far longer than the 512-token context
    qtbot.waitUntil(lambda: not bad.generating, timeout=30000)  # refused by the engine thread, which tokenizes
    assert "context" in bad.conversation.messages[-1].error
    assert bad.view.widgets[-1]._status.text() == bad.conversation.messages[-1].error
    assert good.generating
    qtbot.waitUntil(lambda: not good.generating, timeout=30000)
    assert good.conversation.messages[-1].tokens == 200


def test_a_tab_beyond_parallel_says_it_waits(qtbot, launch):
    window = launch(parallel=1, max_tokens=100000)
    a, b = window.current_tab(), window.new_tab()
    send(qtbot, a, "One")
    qtbot.waitUntil(lambda: bool(a.conversation.messages[-1].text), timeout=30000)
    send(qtbot, b, "Two")
    qtbot.waitUntil(lambda: b.state == WAITING and "free stream" in b.view.widgets[-1]._status.text(), timeout=10000)
    a.stop()
    qtbot.waitUntil(lambda: bool(b.conversation.messages[-1].text), timeout=30000)
    b.stop()
    qtbot.waitUntil(lambda: not b.generating, timeout=10000)


def test_regenerate_edit_and_system_prompt(qtbot, launch):
    window = launch(max_tokens=8)
    tab = window.current_tab()
    click(qtbot, tab.system_toggle)
    assert tab.system_edit.isVisibleTo(tab)
    tab.system_edit.setPlainText("Answer in French.")
    send(qtbot, tab, "Hello")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    first_time = tab.conversation.messages[-1].time
    widgets = tab.view.widgets
    assert widgets[-1]._regenerate.isVisibleTo(tab) and widgets[0]._edit.isVisibleTo(tab)
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
    assert tab.generating and len(tab.conversation.messages) == 2
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    assert tab.conversation.messages[-1].time >= first_time
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert len(tab.conversation.messages) == 2 and tab.composer.text() == "Hello" and tab.editing
    tab.composer.edit.insertPlainText(" again")
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    assert [m.text for m in tab.conversation.messages][0] == "Hello again"
    assert len(tab.conversation.messages) == 2
    assert tab.conversation.engine_messages()[0] == {"role": "system", "content": "Answer in French."}


def test_the_regenerate_and_edit_buttons_work_when_clicked(qtbot, launch, app_home):
    window = launch(max_tokens=6)
    tab = window.current_tab()
    tab.composer.set_text("First words")
    click(qtbot, tab.composer.send_button)
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    first_reply = tab.conversation.messages[-1]
    click(qtbot, tab.view.widgets[-1]._regenerate)
    assert tab.generating and tab.conversation.messages[-1] is not first_reply
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    click(qtbot, tab.view.widgets[0]._edit)
    assert tab.editing and tab.composer.text() == "First words" and tab.composer.edit_bar.isVisible()
    assert not tab.view.widgets[0]._edit.isVisible()  # nothing else to edit while this edit is open
    tab.composer.set_text("Second words")
    click(qtbot, tab.composer.send_button)
    assert not tab.editing and [m.text for m in tab.conversation.messages[:1]] == ["Second words"]
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    saved = conv_file(app_home, tab)["messages"]
    assert [m["role"] for m in saved] == ["user", "assistant"] and saved[0]["text"] == "Second words"


def test_editing_keeps_the_old_turn_until_the_edit_is_sent(qtbot, launch, app_home):
    window = launch(max_tokens=6)
    tab = window.current_tab()
    send(qtbot, tab, "Keep me safe")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    tab.composer.set_text("a draft I was writing")
    on_disk = []  # every message count the file ever shows from here on

    def sample():
        path = app_home / "data" / "conversations" / f"{tab.conversation.id}.json"
        on_disk.append(len(json.loads(path.read_text())["messages"]))
    tab.saver.flush()
    sample()
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert tab.editing and tab.composer.text() == "Keep me safe"
    tab.save()  # whatever writes the file mid-edit (a quit, another save) keeps the turn
    sample()
    assert conv_file(app_home, tab)["draft"] == "a draft I was writing"
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Escape)  # Esc cancels the edit
    assert not tab.editing and tab.composer.text() == "a draft I was writing"
    assert [m.text for m in tab.conversation.messages][0] == "Keep me safe" and len(tab.conversation.messages) == 2
    sample()
    click(qtbot, tab.view.widgets[0]._edit)
    click(qtbot, tab.composer.cancel_edit_button)  # so does Cancel
    assert not tab.editing and tab.composer.text() == "a draft I was writing"
    click(qtbot, tab.view.widgets[0]._edit)
    tab.composer.set_text("Keep me safe, edited")
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return)
    sample()
    qtbot.waitUntil(lambda: (sample(), not tab.generating)[1], timeout=30000)
    sample()
    assert min(on_disk) == 2 and on_disk[-1] == 2
    assert conv_file(app_home, tab)["messages"][0]["text"] == "Keep me safe, edited"
    assert tab.composer.text() == "a draft I was writing"  # the draft comes back after the edit


def test_an_edited_first_message_renames_its_conversation(qtbot, launch):
    window = launch(max_tokens=4)
    tab = window.current_tab()
    send(qtbot, tab, "Old question")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    tab.edit_last()
    tab.composer.set_text("New question")
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return)
    assert tab.title == "New question" and window.tabs.tabText(0) == "New question"
    assert window.windowTitle().startswith("New question")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    tab.rename("My own name")
    tab.edit_last()
    tab.composer.set_text("Newer question")
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return)
    assert tab.title == "My own name"  # a name the user gave stays
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)


def test_shift_enter_is_a_new_line_and_empty_text_is_not_sent(qtbot, launch):
    window = launch(start_engine=False)
    tab = window.current_tab()
    qtbot.keyClicks(tab.composer.edit, "line one")
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(tab.composer.edit, "line two")
    assert tab.composer.text() == "line one\nline two" and not tab.conversation.messages
    tab.composer.set_text("   ")
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return)
    assert not tab.conversation.messages


def test_tabs_new_close_rename_and_history(qtbot, launch, app_home):
    window = launch(max_tokens=4)
    qtbot.keyClick(window.current_tab().composer.edit, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.count() == 2
    tab = window.current_tab()
    send(qtbot, tab, "Name me")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    index = window.tabs.indexOf(tab)
    window.tabs.tabBarDoubleClicked.emit(index)
    editor = window.tabs._editor
    editor.setText("Renamed")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    assert window.tabs.tabText(index) == "Renamed" and conv_file(app_home, tab)["title"] == "Renamed"
    cid = tab.conversation.id
    assert window.history.ids()[0] == cid
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_W, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.count() == 1 and cid in window.history.ids()
    window.open_conversation(cid)  # from the history list
    assert window.current_tab().conversation.id == cid and window.current_tab().title == "Renamed"
    window.delete_conversation(cid)  # at once: the notice's Undo is the way back (test_app_trash)
    assert cid not in window.history.ids() and window.tabs.count() >= 1
    assert not (app_home / "data" / "conversations" / f"{cid}.json").exists()
    assert any(n.text == "Deleted “Renamed”." for n in window.notices.notices())


def test_empty_tabs_leave_no_files(qtbot, launch, app_home):
    window = launch(start_engine=False)
    window.new_tab()
    window.close()
    folder = app_home / "data" / "conversations"
    assert not list(folder.glob("*.json"))


def test_eight_tabs_stream_together(qtbot, launch):
    window = launch(parallel=8, max_tokens=256)
    tabs = [window.current_tab()] + [window.new_tab() for _ in range(7)]
    for i, tab in enumerate(tabs):
        send(qtbot, tab, f"Question {i}")
    peak = []

    def sample():
        peak.append(sum(1 for t in tabs if t.generating and t.conversation.messages[-1].text))
        return not any(t.generating for t in tabs)
    qtbot.waitUntil(sample, timeout=120000)
    assert max(peak) >= 4  # several tabs were typing at the same moment
    assert all(t.conversation.messages[-1].tokens == 256 for t in tabs)
    qtbot.waitUntil(lambda: window.status.pages.text().endswith("idle"), timeout=3000)  # polled usage


def test_state_words_while_waiting_and_reading(qtbot, launch):
    window = launch(parallel=1, max_tokens=100000)
    a, b, c = window.current_tab(), window.new_tab(), window.new_tab()
    for tab, text in ((a, "One"), (b, "Two"), (c, "Three")):
        send(qtbot, tab, text)  # all three at once: one stream, so two wait
    for tab in (a, b, c):
        assert "interrupted" not in tab.view.widgets[-1]._meta.text()  # reading or waiting is not interrupted
    qtbot.waitUntil(lambda: bool(a.conversation.messages[-1].text), timeout=30000)
    b_status, c_status = b.view.widgets[-1]._status, c.view.widgets[-1]._status
    qtbot.waitUntil(lambda: c_status.text() == "Waiting for a free stream (1 ahead)…", timeout=10000)
    assert b_status.text() == "Waiting for a free stream…"  # the only one ahead of it is running
    assert b.state == WAITING and "interrupted" not in b.view.widgets[-1]._meta.text()
    qtbot.waitUntil(lambda: window.status.pages.text().endswith("1 generating, 2 waiting"), timeout=3000)
    a.stop()
    qtbot.waitUntil(lambda: bool(b.conversation.messages[-1].text), timeout=30000)
    assert c_status.text() == "Waiting for a free stream…"  # the count went down with the queue
    b.stop()
    qtbot.waitUntil(lambda: bool(c.conversation.messages[-1].text), timeout=30000)
    c.stop()
    qtbot.waitUntil(lambda: not c.generating, timeout=10000)
    assert a.view.widgets[-1]._meta.text().endswith("interrupted")  # stopped: now it is


CRASHING_APP = """
import asyncio, sys
import qasync
from PySide6.QtWidgets import QApplication
from app.main import configure, create_window
app = QApplication(sys.argv[:1])
configure(app)
loop = qasync.QEventLoop(app)
asyncio.set_event_loop(loop)
window = create_window()
window.show()
for cid in sys.argv[1:]:
    window.open_conversation(cid)  # the user opens two more from the history
window.tabs.setCurrentIndex(1)
with loop:
    loop.run_forever()
"""


def _seed(app_home, ids):
    folder = app_home / "data" / "conversations"
    folder.mkdir(parents=True, exist_ok=True)
    for cid in ids:
        (folder / f"{cid}.json").write_text(json.dumps(
            {"format_version": 1, "id": cid, "title": f"Chat {cid}", "created": "2025-01-01T00:00:00+00:00",
             "updated": "2025-01-01T00:00:00+00:00", "messages": [{"role": "user", "text": f"hi {cid}"}]}))
    (app_home / "state").mkdir(parents=True, exist_ok=True)
    (app_home / "state" / "session.json").write_text(json.dumps({"open_tabs": ids[:1], "active": 0}))


def test_open_tabs_survive_a_kill_9(qtbot, launch, app_home, app_model):
    import os
    import signal
    import subprocess
    import sys
    save_settings(settings_for(app_model))
    _seed(app_home, ["a", "b", "c"])
    session = app_home / "state" / "session.json"
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", LANECHAT_HOME=str(app_home),
               PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen([sys.executable, "-c", CRASHING_APP, "b", "c"], env=env, cwd=repo,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:  # the app writes the open tabs itself, long before any quit
            try:
                saved = json.loads(session.read_text())
            except (OSError, ValueError):
                saved = {}
            if saved.get("open_tabs") == ["a", "b", "c"] and saved.get("active") == 1:
                break
            assert child.poll() is None, child.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, f"session never listed the open tabs: {saved}"
            time.sleep(0.1)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    window = launch(start_engine=False)
    assert [t.conversation.id for t in window.tabs.tabs()] == ["a", "b", "c"]
    assert window.tabs.currentIndex() == 1 and window.history.highlighted() == "b"


def test_the_session_written_at_start_keeps_the_windows_place(qtbot, launch, app_home):
    from PySide6.QtCore import QByteArray
    from PySide6.QtWidgets import QMainWindow
    probe = QMainWindow()
    qtbot.addWidget(probe)
    probe.resize(700, 500)  # inside the offscreen screen (800 × 600)
    _seed(app_home, ["a"])
    session = app_home / "state" / "session.json"
    saved = json.loads(session.read_text())
    saved["geometry"] = bytes(probe.saveGeometry().toBase64()).decode()
    session.write_text(json.dumps(saved))
    window = launch(start_engine=False)
    window.saver.flush()  # what a kill -9 now would leave
    probe.resize(300, 200)
    assert probe.restoreGeometry(QByteArray.fromBase64(json.loads(session.read_text())["geometry"].encode()))
    assert (probe.width(), probe.height()) == (window.width(), window.height()) == (700, 500)


def test_saves_while_streaming_leave_the_gui_thread(qtbot, launch, app_home):
    import threading

    from app.store import ConversationStore

    class RecordingStore(ConversationStore):
        threads: list = []

        def save(self, conv):
            self.threads.append(threading.current_thread() is threading.main_thread())
            super().save(conv)
    window = launch(max_tokens=100000)
    window.store = RecordingStore(window.store.root)
    tab = window.new_tab()
    send(qtbot, tab, "Talk for a while")
    assert RecordingStore.threads == [True]  # before generation, at once: the question is on disk
    qtbot.waitUntil(lambda: len(RecordingStore.threads) >= 2, timeout=30000)  # the periodic save
    tab.stop()
    qtbot.waitUntil(lambda: not tab.generating, timeout=10000)
    tab.saver.flush()
    assert RecordingStore.threads[1:] and not any(RecordingStore.threads[1:])


def test_history_highlight_follows_the_active_tab(qtbot, launch, app_home):
    _seed(app_home, ["a", "b"])
    window = launch(max_tokens=100000)
    assert window.history.highlighted() == "a"  # the restored active tab, from the start
    window.open_conversation("b")
    assert window.history.highlighted() == "b"
    streaming = window.tabs.widget(0)
    send(qtbot, streaming, "Keep writing")  # tab a streams and saves in the background
    window.tabs.setCurrentIndex(1)
    qtbot.waitUntil(lambda: window.history.ids()[0] == "a" and window.history.highlighted() == "b", timeout=30000)
    streaming.stop()
    qtbot.waitUntil(lambda: not streaming.generating, timeout=10000)
    assert window.history.highlighted() == "b"
    window.new_tab()  # a blank tab has no saved conversation: nothing is highlighted
    assert window.history.highlighted() is None


def test_menu_shortcuts_read_as_keys_and_work(qtbot, launch):
    from PySide6.QtGui import QKeySequence
    window = launch(start_engine=False)
    window.new_tab()
    previous = next(a for m in window.menuBar().findChildren(type(window.menuBar().actions()[0].menu()))
                    for a in m.actions() if a.text() == "&Previous tab")
    shown = previous.shortcut().toString(QKeySequence.SequenceFormat.NativeText)
    assert shown == "Ctrl+Shift+Tab" and "Backtab" not in shown
    assert window.tabs.currentIndex() == 1
    qtbot.keyClick(window.current_tab().composer.edit, Qt.Key.Key_Backtab,
                   Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert window.tabs.currentIndex() == 0


def test_export_suggests_a_clean_name_in_the_documents_folder(qtbot, launch, tmp_path):
    from modal import answer_file_dialog

    from app.conversation import Conversation
    from app.transfer import export_path
    named = export_path(Conversation(title="What is a paged KV cache?"), tmp_path)
    assert named == tmp_path / "What is a paged KV cache.md"
    assert export_path(Conversation(title="a/b: c*d"), tmp_path).name == "a b c d.md"
    assert export_path(Conversation(), tmp_path).name == "Conversation.md"
    import platformdirs
    documents = Path(platformdirs.user_documents_dir())
    assert export_path(Conversation(title="x")).parent == (documents if documents.is_dir() else Path.home())

    window = launch(max_tokens=4)
    tab = window.current_tab()
    send(qtbot, tab, "Why is the sky blue?")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    seen = []
    answer_file_dialog(str(tmp_path / "out.md"), seen)
    window.transfers.export_one(tab.conversation.id)
    assert seen and seen[0][1] == "Why is the sky blue"  # the format's ending follows the filter chosen
    assert (tmp_path / "out.md").read_text().startswith("# Why is the sky blue?")


def test_buttons_around_the_window_work_when_clicked(qtbot, launch, run_async, app_home):
    from modal import when_modal
    from PySide6.QtWidgets import QPushButton, QTabBar, QToolButton

    from app.settings_dialog import SettingsDialog
    window = launch(start_engine=False, model=str(app_home / "no-such-model"))
    click(qtbot, window.history.new_button)  # New chat
    assert window.tabs.count() == 2
    close = window.tabs.tabBar().tabButton(1, QTabBar.ButtonPosition.RightSide)
    click(qtbot, close)  # a tab's close button
    assert window.tabs.count() == 1
    opened = []

    def close_settings():
        when_modal(SettingsDialog, lambda dlg: (opened.append(dlg), dlg.reject()))
    assert not run_async(window.start_engine(), timeout=60)
    notice = next(n for n in window.notices.notices() if "could not be loaded" in n.text)
    close_settings()
    click(qtbot, next(b for b in notice.findChildren(QPushButton) if b.text() == "Open Settings…"))
    assert len(opened) == 1
    close_settings()
    click(qtbot, window.status.fix)  # the status bar's Open Settings…
    assert len(opened) == 2
    dismiss = next(b for b in notice.findChildren(QToolButton) if b.toolTip() == "Dismiss")
    click(qtbot, dismiss)
    assert notice not in window.notices.notices()


def test_every_tab_stop_shows_where_the_focus_is(qtbot, launch):
    from PySide6.QtWidgets import QApplication

    from app.main import configure
    configure(QApplication.instance())  # the app's own look, as `lanechat` starts with it
    window = launch(max_tokens=4)
    tab = window.current_tab()
    send(qtbot, tab, "Hello")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    tab.composer.edit.setFocus()
    chain = []
    for _ in range(60):  # walk the Tab chain as a keyboard user does, once round
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
        widget = QApplication.focusWidget()
        if widget in chain:
            break
        chain.append(widget)
    assert tab.composer.send_button in chain and tab.view.widgets[-1]._regenerate in chain

    def look(widget):
        qtbot.wait(20)
        return (widget.parentWidget() or widget).grab().toImage()
    unmarked = []
    for widget in chain:
        widget.setFocus(Qt.FocusReason.TabFocusReason)
        focused = look(widget)
        window.menuBar().setFocus()
        widget.clearFocus()
        if look(widget) == focused:
            unmarked.append(f"{type(widget).__name__} {widget.objectName()} "
                            f"{getattr(widget, 'text', lambda: '')()}")
    assert not unmarked, unmarked


def test_the_active_tab_comes_back_even_after_blank_tabs(qtbot, launch, app_home):
    _seed(app_home, ["a", "b"])
    (app_home / "state" / "session.json").write_text(json.dumps({"open_tabs": ["blank1", "a", "blank2", "b"],
                                                                 "active": 3}))
    window = launch(start_engine=False)
    assert [t.conversation.id for t in window.tabs.tabs()] == ["a", "b"] and window.current_tab().conversation.id == "b"
