"""The app's targets of `make fuzz`: conversation files (loaded, shown in a tab and the history,
saved again), whole app starts on a data folder of mutated files, and leftover temp files of
killed writes. Qt runs offscreen, created in the forked child only."""
from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path

from app.conversation import FormatError

import fuzz_files as ff
from fuzz_targets import BugError, Case

BASE = {
    "format_version": 1, "id": "c1", "title": "A chat", "created": "2025-03-01T10:00:00+00:00",
    "updated": "2025-03-01T10:05:00+00:00", "model": "tiny", "settings": {"parallel": 2, "sampling": {"seed": 0}},
    "system_prompt": "Be brief.", "draft": "", "snapshot": None,
    "messages": [
        {"role": "user", "text": "Hello", "time": "2025-03-01T10:00:00+00:00", "tokens": None, "tok_s": None,
         "interrupted": False, "error": None},
        {"role": "assistant", "text": "Hi! How can I help?", "time": "2025-03-01T10:00:02+00:00", "tokens": 7,
         "tok_s": 21.5, "interrupted": False, "error": None},
        {"role": "user", "text": "More", "time": "2025-03-01T10:01:00+00:00", "tokens": None, "tok_s": None,
         "interrupted": False, "error": None},
        {"role": "assistant", "text": "", "time": "2025-03-01T10:01:01+00:00", "tokens": 0, "tok_s": None,
         "interrupted": True, "error": "engine error: boom"},
    ],
}
FOCUS = [("error",), ("tok_s",), ("created",), ("updated",), ("time",), ("title",), ("system_prompt",), ("draft",),
         ("settings",), ("snapshot",), ("tokens",), ("interrupted",), ("format_version",), ("id",), ("messages",)]
DATES = ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "0001-01-01", "2025-13-45T99:99:99",
         "now", "", "2025-03-01T10:00:00+99:00", "1970-01-01T00:00:00", "+10000-01-01"]


def conversation(rng: random.Random) -> tuple[bytes, str]:
    """A conversation file's bytes after one mutation."""
    conv = copy.deepcopy(BASE)
    r = rng.random()
    if r < 0.15:
        key = rng.choice(["created", "updated"]) if rng.random() < 0.5 else None
        target = conv if key else rng.choice(conv["messages"])
        key = key or "time"
        target[key] = rng.choice(DATES)
        what = f"{key} = {target[key]!r}"
    elif r < 0.25:
        m = rng.choice(conv["messages"])
        m["text"] = rng.choice(["lone \ud800 surrogate", "\udcff" * 10, "pair \ud83d\ude00 halves"])
        what = f"message text {m['text']!r}"
    elif r < 0.3:
        conv["system_prompt"] = "a" * (256 << 10)
        what = "a 256 KB one-word system prompt"
    elif r < 0.75:
        msg_focus = [("messages", i, k[0]) for i in range(4) for k in FOCUS[:6] + FOCUS[10:12]]
        what = ff.mutate_json_value(rng, conv, [(k,) for (k,) in FOCUS] + msg_focus)
    else:
        data, what = ff.mutate_json_text(rng, json.dumps(conv))
        return data, what
    text = ff.dump(conv) if rng.random() < 0.5 else json.dumps(conv, ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass"), what


def _qt():
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication
    return QApplication.instance() or QApplication([])


def conversation_case(rng: random.Random, folder: Path) -> Case:
    root = folder / "conversations"
    root.mkdir()
    data, what = conversation(rng)
    (root / "c1.json").write_bytes(data)

    def run() -> str:
        from app.chat_tab import ChatTab
        from app.engine_bridge import EngineBridge
        from app.history import HistoryPanel
        from app.store import ConversationStore
        app = _qt()
        store = ConversationStore(root)
        convs, notices = store.load_all()
        if not convs:
            raise FormatError(notices[0]) if notices else BugError("the file vanished without a notice")
        conv = convs[0]
        bridge = EngineBridge()
        tab = ChatTab(conv, store, bridge)
        tab.show()
        history = HistoryPanel()
        history.set_conversations(convs, {conv.id})
        history.show()
        app.processEvents()
        tab.save()  # saved again: lone surrogates must survive
        again = store.load(conv.id)
        if _joined(again.to_dict()) != _joined(conv.to_dict()):
            raise BugError("saved and read back, the conversation changed")
        return "valid"
    return Case("conversation", what, run, folder)


def app_start_case(rng: random.Random, folder: Path) -> Case:
    """A data folder of several mutated conversations, all listed in the session's open tabs."""
    home = folder / "home"
    conv_dir = home / "data" / "conversations"
    conv_dir.mkdir(parents=True)
    whats, ids = [], []
    for i in range(rng.randint(1, 4)):
        data, what = conversation(rng)
        ids.append(f"c{i}")
        (conv_dir / f"c{i}.json").write_bytes(data)
        whats.append(what)
    session = {"open_tabs": ids, "active": rng.choice([0, -5, 99, "x", None]),
               "geometry": rng.choice(["", "\ud800", 5]),
               "splitter": "", "sidebar": rng.choice([True, "no"])}
    (home / "state").mkdir()
    (home / "state" / "session.json").write_text(json.dumps(session))
    if rng.random() < 0.5:
        settings = {"format_version": 1, "engine": {"model": None, "backend": "numpy", "parallel": 2, "context": 512,
                                                   "memory_gib": None, "sampling": {"temperature": 0.7, "stop": []}}}
        whats.append("settings.json " + ff.mutate_json_value(rng, settings))
        (home / "config").mkdir()
        (home / "config" / "settings.json").write_text(ff.dump(settings))

    def run() -> str:
        os.environ["LANECHAT_HOME"] = str(home)
        app = _qt()
        from app.main import create_window
        window = create_window()
        window.show()
        app.processEvents()
        window.close()
        app.processEvents()
        return "valid"
    return Case("app-start", f"{len(ids)} files: " + "; ".join(whats), run, folder)


def leftovers_case(rng: random.Random, folder: Path) -> Case:
    """A kill -9 between the temp write and the rename: the temp files, and what must come of them."""
    from app.atomic import json_bytes
    root = folder / "conversations"
    root.mkdir()
    saved = copy.deepcopy(BASE)
    saved["messages"] = saved["messages"][: rng.randint(0, 4)]
    if rng.random() < 0.8:
        (root / "c1.json").write_bytes(json_bytes(saved))
    temps, candidates = [], []
    base = saved["messages"] if (root / "c1.json").exists() else []
    for i in range(rng.randint(1, 3)):
        t = copy.deepcopy(BASE)
        kind = rng.choice(["longer", "shorter", "other", "garbage", "grown"])
        if kind == "longer":
            t["messages"] = saved["messages"] + [{"role": "user", "text": f"newest {i}"}]
        elif kind == "shorter":
            t["messages"] = saved["messages"][:-1]
        elif kind == "other":
            t["messages"] = [{"role": "user", "text": "something else"}]
        elif kind == "grown" and saved["messages"] and saved["messages"][-1]["role"] == "assistant":
            t["messages"] = copy.deepcopy(saved["messages"])
            t["messages"][-1]["text"] += " and more"
        (root / f".c1.json.tmp{i}x.tmp").write_bytes(b"{not json" if kind == "garbage" else json_bytes(t))
        temps.append(kind)
        if kind != "garbage":
            candidates.append(t["messages"])
    expect = base
    for ms in candidates:  # the longest that extends the saved messages; the first of equals
        if _extends(ms, base) and _size(ms) > _size(expect if expect is not base else []) :
            expect = ms
    (root / ".other.json.abc.tmp").write_bytes(b"half a wr")

    def run() -> str:
        from app.store import ConversationStore
        store = ConversationStore(root)
        store.recover(min_age_s=0)
        left = [p.name for p in root.glob(".*.tmp")]
        if left:
            raise BugError(f"temp files left: {left}")
        have = [m["text"] for m in json.loads((root / "c1.json").read_text())["messages"]] \
            if (root / "c1.json").exists() else []
        if have != [m["text"] for m in expect]:
            raise BugError(f"after recovery the messages are {have}, expected {[m['text'] for m in expect]}")
        return "valid"
    return Case("kill-9", f"saved {len(saved['messages'])} messages, temps {temps}", run, folder)


def _texts(messages: list[dict]) -> list[tuple]:
    return [(m["role"], m["text"]) for m in messages]


def _extends(new: list[dict], old: list[dict]) -> bool:
    """The rule of ConversationStore.recover, written again from its words."""
    a, b = _texts(new), _texts(old)
    if not b:
        return bool(a)
    if len(a) > len(b) and a[: len(b)] == b:
        return True
    return (len(a) >= len(b) and a[: len(b) - 1] == b[:-1] and b[-1][0] == a[len(b) - 1][0] == "assistant"
            and a[len(b) - 1][1].startswith(b[-1][1]) and len(a[len(b) - 1][1]) > len(b[-1][1]))


def _size(messages: list[dict]) -> tuple[int, int]:
    return (len(messages), len(messages[-1]["text"]) if messages else -1)


def _joined(obj):
    """Strings with surrogate pairs joined: JSON reads an escaped pair back as the one character."""
    if isinstance(obj, str):
        return obj.encode("utf-16", "surrogatepass").decode("utf-16", "surrogatepass")
    if isinstance(obj, dict):
        return {_joined(k): _joined(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_joined(v) for v in obj]
    return obj
