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

def _v2(m: dict, i: int, parent: int | None, **more) -> dict:
    return {**m, "id": i, "parent": parent, "reasoning": "", "reasoning_tokens": None, "accepted": None,
            "prompt_tokens": None, "ttft": None, "left_out": 0, **more}


# Format 2: a tree (an earlier reply and an earlier edit in `branches`), thinking, pins, the limit's choice.
M = BASE["messages"]
BASE2 = {
    **BASE, "format_version": 2, "engine": "", "thinking": True, "pinned": True, "at_limit": "drop",
    "messages": [_v2(M[0], 1, None), _v2(M[1], 2, 1, reasoning="Greet back.", reasoning_tokens=3, accepted=2.5,
                                                 prompt_tokens=12, ttft=0.2),
                 _v2(M[2], 5, 2), _v2(M[3], 6, 5, left_out=2)],
    "branches": [_v2({**M[2], "text": "Less"}, 3, 2), _v2({**M[1], "text": "Hello."}, 4, 3, tokens=2)],
}
# Format 3: the conversation's own sampling, files attached (sent and in the draft), finish reasons.
BASE3 = {
    **BASE2, "format_version": 3, "sampling": {"temperature": 0.2, "top_k": 5, "max_tokens": 64},
    "draft_attachments": [{"name": "todo.md", "text": "- more\n", "tokens": 3}],
    "messages": [{**BASE2["messages"][0], "attachments": [{"name": "a.py", "text": "x = 1\n", "tokens": 4}]},
                 {**BASE2["messages"][1], "finish_reason": "length"}, *BASE2["messages"][2:]],
}
TOP_FOCUS = ["created", "updated", "title", "system_prompt", "draft", "settings", "snapshot", "format_version", "id",
             "messages", "branches", "thinking", "pinned", "at_limit", "engine", "sampling", "draft_attachments"]
MESSAGE_FOCUS = ["error", "tok_s", "time", "tokens", "interrupted", "reasoning", "reasoning_tokens", "id", "parent",
                 "accepted", "ttft", "left_out", "prompt_tokens", "role", "text", "attachments", "finish_reason"]
FILE_FOCUS = [("messages", 0, "attachments", 0, k) for k in ("name", "text", "tokens")] + [
    ("sampling", k) for k in ("temperature", "top_p", "top_k", "seed", "max_tokens")]
DATES = ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "0001-01-01", "2025-13-45T99:99:99",
         "now", "", "2025-03-01T10:00:00+99:00", "1970-01-01T00:00:00", "+10000-01-01"]


def tree(rng: random.Random, conv: dict) -> str:
    """A tree no Lanechat writes: long chains listed child first, repeated ids, cycles, strays."""
    kind = rng.choice(["reversed chain", "repeated ids", "cycle", "self parent", "unchained path", "wide"])
    n = rng.choice([10, 1000, 50_000])
    top = conv["messages"][-1]["id"]
    if kind == "reversed chain":  # each message's parent comes after it in the list
        conv["branches"] = [_v2({"role": ("user", "assistant")[i % 2], "text": f"b{i}"}, top + n - i,
                                top + n - i - 1 if i < n - 1 else 1) for i in range(n)]
    elif kind == "repeated ids":
        conv["branches"] = [_v2({"role": "assistant", "text": f"r{i}"}, 2 + i % 3, 1) for i in range(n)]
    elif kind == "cycle":
        conv["branches"] = [_v2({"role": "user", "text": "a"}, top + 1, top + 2),
                            _v2({"role": "user", "text": "b"}, top + 2, top + 1)]
    elif kind == "self parent":
        conv["messages"][1]["parent"] = conv["messages"][1]["id"]
    elif kind == "unchained path":
        rng.shuffle(conv["messages"])
    else:  # many alternatives of one reply
        conv["branches"] = [_v2({"role": "assistant", "text": f"w{i}"}, top + 1 + i, 1) for i in range(n)]
    return f"tree: {kind}" + (f" of {n}" if kind in ("reversed chain", "repeated ids", "wide") else "")


def conversation(rng: random.Random) -> tuple[bytes, str]:
    """A conversation file's bytes after one mutation."""
    conv = copy.deepcopy(rng.choice([BASE3, BASE3, BASE2, BASE2, BASE]))
    r = rng.random()
    if conv["format_version"] >= 2 and r < 0.1:
        what = tree(rng, conv)
    elif r < 0.15:
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
        msg_focus = [(where, i, k) for where in ("messages", "branches") for i in range(4) for k in MESSAGE_FOCUS]
        what = ff.mutate_json_value(rng, conv, [(k,) for k in TOP_FOCUS] + msg_focus + FILE_FOCUS)
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
        from app import branches, search
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
        # what the tab's other actions do with the tree: switch branches, fork, export, search, send
        other = copy.deepcopy(conv)
        for i in range(len(other.messages) - 1, -1, -1):
            options = branches.siblings(other, i)
            if len(options) > 1:
                branches.switch(other, i, options[0])
        for i in range(len(conv.messages)):
            branches.fork(conv, i)
        conv.to_markdown()
        search.find(conv, "e")
        conv.engine_messages(min(conv.messages[-1].left_out, len(conv.messages)) if conv.messages else 0)
        return "valid"
    return Case("conversation", what, run, folder)


# The other files an app start reads, as Lanechat writes them.
CONFIG_FILES = {
    "settings.json": {"format_version": 1, "sampling_chosen": ["temperature"], "engine": {
        "model": None, "backend": "numpy", "parallel": 2, "context": 512, "kv_dtype": "bf16", "paging": "pages",
        "page_tokens": 256, "memory_gib": None, "prefill_chunk": 128, "drafter": "ngram", "draft_tokens": 4,
        "prompt_cache_gib": 0.5, "snapshot_disk_gib": 4.0,
        "sampling": {"temperature": 0.7, "top_p": 0.95, "top_k": 40, "max_tokens": 1024, "seed": 0, "stop": [],
                     "ignore_eos": False}}},
    "connections.json": {"format_version": 1, "remotes": [
        {"id": "ab12", "name": "vLLM", "base_url": "http://127.0.0.1:9/v1", "api_key": "", "model": "m"}],
        "server": {"enabled": False, "port": 0, "lan": False, "api_key": ""}},
    "preferences.json": {"idle_unload_minutes": 30},
    "models-used.json": {"/nowhere/model.gguf": 1700000000.0, "/tmp": 1700000001.5},
}


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
    (home / "config").mkdir()
    for name, base in CONFIG_FILES.items():
        if rng.random() < 0.35:
            raw = copy.deepcopy(base)
            what = ff.mutate_json_value(rng, raw) if rng.random() < 0.8 else "nested 100000 deep"
            text = ff.dump(raw) if not what.startswith("nested 1") else ff.deep_json(100_000)
            where = home / ("state" if name == "models-used.json" else "config") / name
            where.write_text(text, encoding="utf-8", errors="surrogatepass")
            whats.append(f"{name} {what}")

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
    v2 = rng.random() < 0.5
    template = {**BASE2, "branches": []} if v2 else BASE

    def message(text: str, after: list[dict]) -> dict:  # as Conversation.add numbers a new one
        m = {"role": "user", "text": text}
        return _v2(m, max((x["id"] for x in after), default=0) + 1, after[-1]["id"] if after else None) if v2 else m
    saved = copy.deepcopy(template)
    saved["messages"] = saved["messages"][: rng.randint(0, 4)]
    if rng.random() < 0.8:
        (root / "c1.json").write_bytes(json_bytes(saved))
    temps, candidates = [], []
    base = saved["messages"] if (root / "c1.json").exists() else []
    for i in range(rng.randint(1, 3)):
        t = copy.deepcopy(template)
        kind = rng.choice(["longer", "shorter", "other", "garbage", "grown"])
        if kind == "longer":
            t["messages"] = saved["messages"] + [message(f"newest {i}", saved["messages"])]
        elif kind == "shorter":
            t["messages"] = saved["messages"][:-1]
        elif kind == "other":
            t["messages"] = [message("something else", [])]
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
    return Case("kill-9", f"format {template['format_version']}, saved {len(saved['messages'])} messages, "
                          f"temps {temps}", run, folder)


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
