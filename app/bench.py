"""`python -m app.bench`: how fast the window stays while a long reply streams, and how fast a long
conversation opens. Qt offscreen, on this machine's CPU; not part of the test run (no test times).

1. The cost of one streaming update (the new text into the reply, then Qt's layout and paint of
   the window) when the reply is 1K, 8K and 32K characters long, as CPU time of this process (the
   wall clock also counts other programs on a shared machine; it is shown beside); then what the
   same update costs as a QLabel.setText of the whole reply, for comparison. Target: <= 4 ms at
   32K (the drain period is 33 ms, and the window has other tabs to draw).
2. The time from opening a 100-message conversation with code blocks to its first frame, and to
   the moment its column is filled. Target: <= 150 ms to show it.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

SIZES = (1_000, 8_000, 32_000)
STEP_CHARS = 24  # about one drain period of tokens at ~50 tok/s
TARGET_UPDATE_MS, TARGET_OPEN_MS = 4.0, 150.0

_WORDS = ("the stream reads its prompt in chunks and then decodes one token per step while the "
          "other tabs keep their own pages of the pool so nothing waits longer than it must").split()


def reply_text(chars: int, seed: int = 0) -> str:
    """Chat-like Markdown: paragraphs, a list now and then, a fenced code block now and then."""
    rnd = random.Random(seed)
    parts: list[str] = []
    while sum(len(p) + 2 for p in parts) < chars:
        kind = rnd.random()
        if kind < 0.15:
            body = "\n".join(f"    value_{i} = compute({i}, cache=pages[{i}])" for i in range(rnd.randint(3, 12)))
            parts.append(f"```python\ndef step():\n{body}\n    return value_0\n```")
        elif kind < 0.3:
            parts.append("\n".join(f"{i}. " + " ".join(rnd.choices(_WORDS, k=rnd.randint(5, 15)))
                                   for i in range(1, rnd.randint(3, 6))))
        else:
            parts.append(" ".join(rnd.choices(_WORDS, k=rnd.randint(30, 90))).capitalize() + ".")
    return "\n\n".join(parts)[:chars]


def _app():
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("LANECHAT_HOME", tempfile.mkdtemp(prefix="lanechat-bench-"))
    from PySide6.QtWidgets import QApplication

    from . import theme
    app = QApplication.instance() or QApplication(sys.argv[:1])
    theme.apply(app)
    return app


def _window(app, tab):
    from PySide6.QtWidgets import QMainWindow
    window = QMainWindow()
    window.setCentralWidget(tab)
    window.resize(1200, 800)
    window.show()
    app.processEvents()
    return window


def _tab(messages):
    from .chat_tab import ChatTab
    from .conversation import Conversation
    from .engine_bridge import EngineBridge
    from .store import ConversationStore
    conv = Conversation(title="bench")
    conv.messages.extend(messages)
    return ChatTab(conv, ConversationStore(Path(tempfile.mkdtemp(prefix="lanechat-bench-"))), EngineBridge())


def _history(n: int) -> list:
    from .conversation import Message
    return [Message("user", f"Question {i}: how do pages and windows share one address space?") if i % 2 == 0
            else Message("assistant", reply_text(1500, seed=i), tokens=400, tok_s=50.0) for i in range(n)]


def _near(samples: list[tuple[int, float, float]], size: int, column: int) -> list[float]:
    return sorted(s[column] for s in samples if abs(s[0] - size) <= max(300, size // 20))


def measure_updates(app, text: str) -> list[tuple[int, float, float]]:
    """(reply length, CPU ms, wall ms) for each streaming update of `text` into a reply in a tab."""
    from .conversation import Message
    tab = _tab(_history(4))
    window = _window(app, tab)
    message = tab.conversation.add(Message("assistant", "", interrupted=True))
    widget = tab.view.add(message)
    widget.show_streaming()
    samples = []
    for at in range(0, len(text), STEP_CHARS):
        piece = text[at:at + STEP_CHARS]
        c0, t0 = time.process_time(), time.perf_counter()
        message.text += piece
        widget.append(piece)
        app.processEvents()  # layout, follow the end, paint: what the user waits for
        samples.append((at + len(piece), (time.process_time() - c0) * 1000, (time.perf_counter() - t0) * 1000))
    window.close()
    return samples


def measure_label_updates(app, text: str, sizes: tuple[int, ...]) -> dict[int, float]:
    """The same update as QLabel.setText of the whole reply (how a label-based view grows)."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QLabel, QScrollArea
    area = QScrollArea(widgetResizable=True)
    label = QLabel(wordWrap=True, textFormat=Qt.TextFormat.PlainText)
    area.setWidget(label)
    area.resize(1200, 800)
    area.show()
    out = {}
    for size in sizes:
        times = []
        for k in range(5):
            c0 = time.process_time()
            label.setText(text[:size + k * STEP_CHARS])
            app.processEvents()
            times.append((time.process_time() - c0) * 1000)
        out[size] = statistics.median(times)
    area.close()
    return out


def measure_open(app, messages: int, repeats: int) -> tuple[list[float], list[float], list[float]]:
    """CPU ms to the first frame and until the column is filled, and wall ms to the first frame,
    of opening a conversation of `messages`."""
    from PySide6.QtWidgets import QMainWindow
    first, filled, wall = [], [], []
    history = _history(messages)
    for _ in range(repeats):
        window = QMainWindow()
        window.resize(1200, 800)
        window.show()
        app.processEvents()
        c0, t0 = time.process_time(), time.perf_counter()
        tab = _tab(history)
        window.setCentralWidget(tab)
        app.processEvents()  # laid out and painted
        first.append((time.process_time() - c0) * 1000)
        wall.append((time.perf_counter() - t0) * 1000)
        while tab.view.filling:  # older messages built while the column is not yet full
            app.processEvents()
        filled.append((time.process_time() - c0) * 1000)
        window.close()
        app.processEvents()
    return first, filled, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100, help="messages in the opened conversation")
    parser.add_argument("--repeats", type=int, default=5, help="times the conversation is opened")
    a = parser.parse_args(argv)
    app = _app()
    text = reply_text(max(SIZES) + 2000)
    samples = measure_updates(app, text)
    label = measure_label_updates(app, text, SIZES)
    print("streaming update (new text in, layout and paint): CPU ms of this process")
    print(f"  {'reply':>6}  {'median':>6}  {'p95':>6}  {'max':>6}  {'wall median':>11}"
          "   QLabel.setText of the whole reply")
    at_32k = 0.0
    for size in SIZES:
        cpu, wall = _near(samples, size, 1), _near(samples, size, 2)
        median, p95 = statistics.median(cpu), cpu[int(0.95 * (len(cpu) - 1))]
        at_32k = median if size == max(SIZES) else at_32k
        print(f"  {size // 1000:>5}K  {median:6.2f}  {p95:6.2f}  {cpu[-1]:6.2f}  {statistics.median(wall):11.2f}"
              f"   {label[size]:7.2f}")
    first, filled, wall = measure_open(app, a.messages, a.repeats)
    print(f"open a {a.messages}-message conversation with code blocks (CPU ms, median of {a.repeats}): "
          f"first frame {statistics.median(first):.0f} (wall {statistics.median(wall):.0f}), "
          f"column filled {statistics.median(filled):.0f}")
    ok_update, ok_open = at_32k <= TARGET_UPDATE_MS, statistics.median(first) <= TARGET_OPEN_MS
    print(f"targets: <= {TARGET_UPDATE_MS:g} ms per update at 32K: {'met' if ok_update else 'NOT met'}; "
          f"<= {TARGET_OPEN_MS:g} ms to show {a.messages} messages: {'met' if ok_open else 'NOT met'}")
    return 0 if ok_update and ok_open else 1


if __name__ == "__main__":
    sys.exit(main())
