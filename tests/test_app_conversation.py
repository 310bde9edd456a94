"""Conversation data: titles, the history sent to the engine, JSON round trip, Markdown export,
a conversation's own sampling, attached files, and files of the version before this one."""
import json
import math
import shutil
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.attachments import Attachment
from app.conversation import FORMAT_VERSION, Conversation, FormatError, Message, timestamp, title_from
from app.markdown import split_blocks
from app.store import ConversationStore
from engine import SamplingParams

V2 = Path(__file__).parent / "fixtures" / "conversations" / "v2.json"


def test_title_is_the_first_line_cut_at_a_word():
    assert title_from("\n  Why is the sky blue?\nMore detail") == "Why is the sky blue?"
    long = "Explain the difference between paged attention and a contiguous window in detail please"
    title = title_from(long)
    assert title.endswith("…") and len(title) <= 49 and long.startswith(title[:-1])


def test_first_user_message_names_the_conversation_once():
    c = Conversation()
    c.add(Message("user", "First question"))
    c.add(Message("user", "Second question"))
    assert c.title == "First question"


def test_engine_messages_carry_system_prompt_and_skip_empty_replies():
    c = Conversation(system_prompt="Be brief.")
    c.add(Message("user", "hi"))
    c.add(Message("assistant", "", interrupted=True, error="boom"))
    c.add(Message("user", "again"))
    c.add(Message("assistant", "partial", interrupted=True))
    assert c.engine_messages() == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
        {"role": "user", "content": "again"}, {"role": "assistant", "content": "partial"}]


def test_json_round_trip_keeps_everything():
    c = Conversation(system_prompt="sys", model="m", settings={"parallel": 2}, draft="unsent")
    c.add(Message("user", "q"))
    c.add(Message("assistant", "a", tokens=3, tok_s=12.5, interrupted=True))
    d = c.to_dict()
    assert d["format_version"] == FORMAT_VERSION
    assert {"title", "created", "updated", "model", "settings", "system_prompt", "messages", "snapshot"} <= set(d)
    assert set(d["messages"][1]) >= {"role", "text", "time", "tokens", "tok_s", "interrupted"}
    assert Conversation.from_dict(d) == c


@pytest.mark.parametrize("raw", [[], {}, {"format_version": 1, "id": "x"},
                                 {"format_version": 1, "id": "x", "messages": [{"role": "robot", "text": "?"}]},
                                 {"format_version": FORMAT_VERSION + 1, "id": "x", "messages": []}])
def test_unreadable_dicts_raise_format_error(raw):
    with pytest.raises(FormatError):
        Conversation.from_dict(raw)


def test_markdown_export():
    c = Conversation(system_prompt="Be kind.", model="SmolLM2")
    c.add(Message("user", "Hello"))
    c.add(Message("assistant", "```py\nprint(1)\n```", interrupted=True))
    md = c.to_markdown()
    assert md.startswith("# Hello\n")
    assert "> Be kind." in md and "## You\n\nHello" in md
    assert "## Assistant (interrupted)\n\n```py\nprint(1)\n```" in md


def test_a_reply_cut_inside_code_is_closed_in_the_export_so_the_next_message_is_not_code():
    c = Conversation()
    c.add(Message("user", "Write code"))
    c.add(Message("assistant", "Here:\n````python\ndef f():\n    return [1, 2"))
    c.add(Message("user", "Thanks"))
    md = c.to_markdown()
    assert "    return [1, 2\n````\n\n## You\n\nThanks" in md
    blocks = split_blocks(md)
    assert [b.kind for b in blocks] == ["text", "code", "text"] and "Thanks" in blocks[-1].text


def test_seed_zero_draws_a_fresh_seed_for_every_reply():
    from app.reply import reply_sampling
    from engine import SamplingParams
    seeds = {reply_sampling(SamplingParams(seed=0)).seed for _ in range(20)}
    assert len(seeds) > 15 and 0 not in seeds
    assert reply_sampling(SamplingParams(seed=42)).seed == 42


# --- validation into typed fields --------------------------------------------------------------

GOOD = {"format_version": 1, "id": "c", "title": "t", "created": "2025-01-01T00:00:00+00:00",
        "updated": "2025-01-02T00:00:00+00:00", "model": "m", "settings": {"parallel": 2}, "system_prompt": "s",
        "draft": "d", "snapshot": None,
        "messages": [{"role": "user", "text": "q", "time": "2025-01-01T00:00:00+00:00"},
                     {"role": "assistant", "text": "a", "time": "2025-01-01T00:00:01+00:00", "tokens": 3,
                      "tok_s": 9.5, "interrupted": False, "error": None}]}
ANY = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=30) \
    | st.sampled_from(["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "2025-02-30", "\ud800"]) \
    | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
# Format 2: ids and parents, an earlier reply in `branches`, thinking, a reply's measurements
GOOD2 = {**GOOD, "format_version": 2, "engine": "", "thinking": False, "pinned": True, "at_limit": "drop",
         "messages": [{**GOOD["messages"][0], "id": 1, "parent": None},
                      {**GOOD["messages"][1], "id": 3, "parent": 1, "reasoning": "r", "reasoning_tokens": 2,
                       "accepted": 2.5, "prompt_tokens": 9, "ttft": 0.25, "left_out": 0}],
         "branches": [{**GOOD["messages"][1], "id": 2, "parent": 1, "text": "older"}]}
# Format 3: the conversation's own sampling, attached files (sent and in the draft), finish reasons
GOOD3 = {**GOOD2, "format_version": 3, "sampling": {"temperature": 0.2, "max_tokens": 64},
         "draft_attachments": [{"name": "next.md", "text": "# later\n", "tokens": 3}],
         "messages": [{**GOOD2["messages"][0], "attachments": [{"name": "a.py", "text": "x = 1\n", "tokens": 4}]},
                      {**GOOD2["messages"][1], "finish_reason": "length"}],
         "branches": [{**GOOD2["branches"][0], "finish_reason": "stop"}]}
MESSAGE_KEYS = ("role", "text", "time", "tokens", "tok_s", "interrupted", "error", "id", "parent", "reasoning",
                "reasoning_tokens", "accepted", "prompt_tokens", "ttft", "left_out", "attachments", "finish_reason")
FIELDS = [(k,) for k in GOOD3] + [(where, i, k) for where, n in (("messages", 2), ("branches", 1))
                                  for i in range(n) for k in MESSAGE_KEYS] + [
    ("sampling", k) for k in ("temperature", "top_p", "top_k", "seed", "max_tokens")] + [
    (*where, 0, k) for where in (("messages", 0, "attachments"), ("draft_attachments",))
    for k in ("name", "text", "tokens")]


def put(raw, path: tuple, value) -> None:
    """Set raw[path] = value; a path inside a field an earlier change replaced does not apply."""
    for k in path[:-1]:
        if isinstance(raw, dict) and k in raw or isinstance(raw, list) and isinstance(k, int) and k < len(raw):
            raw = raw[k]
        else:
            return
    if isinstance(raw, dict) or isinstance(raw, list) and isinstance(path[-1], int) and path[-1] < len(raw):
        raw[path[-1]] = value


def shown_everywhere(t: str) -> bool:
    """What the views do with a timestamp: parse it, convert it to local time, count days."""
    if t == "":
        return True
    d = datetime.fromisoformat(t).astimezone()
    return (datetime.now().astimezone().date() - d.date()).days is not None


@settings(max_examples=500, deadline=None)
@given(st.sampled_from([GOOD, GOOD2, GOOD3]),
       st.lists(st.tuples(st.sampled_from(FIELDS), ANY), min_size=1, max_size=4))
def test_a_loaded_conversation_has_typed_fields_or_is_refused(good, changes):
    raw = json.loads(json.dumps(good))
    for path, value in changes:
        put(raw, path, value)
    try:
        c = Conversation.from_dict(raw)
    except FormatError:
        return
    for name in ("id", "title", "created", "updated", "model", "system_prompt", "draft", "engine"):
        assert isinstance(getattr(c, name), str)
    assert isinstance(c.settings, dict) and (c.snapshot is None or isinstance(c.snapshot, dict))
    assert shown_everywhere(c.created) and shown_everywhere(c.updated)
    assert c.thinking in (None, True, False) and type(c.pinned) is bool and c.at_limit in ("refuse", "drop")
    counts = ("tokens", "reasoning_tokens", "prompt_tokens", "left_out")
    for m in c.messages + c.branches:
        assert m.role in ("user", "assistant") and isinstance(m.text, str) and shown_everywhere(m.time)
        assert all(getattr(m, k) is None or (type(getattr(m, k)) is int and getattr(m, k) >= 0) for k in counts)
        for k in ("tok_s", "accepted", "ttft"):
            assert getattr(m, k) is None or (type(getattr(m, k)) is float and math.isfinite(getattr(m, k)))
        assert type(m.interrupted) is bool and (m.error is None or isinstance(m.error, str))
        assert isinstance(m.reasoning, str) and (m.role == "assistant" or not m.reasoning)
    ids = [m.id for m in c.messages + c.branches]
    assert all(type(i) is int and i > 0 for i in ids) and len(set(ids)) == len(ids)
    assert all(m.parent == (c.messages[i - 1].id if i else None) for i, m in enumerate(c.messages))
    assert all(m.parent is None or m.parent in ids for m in c.branches)  # every branch hangs in the tree
    c.sampling_for(SamplingParams()).validate()  # whatever the file said, a reply can run with it
    for a in c.draft_attachments + [a for m in c.messages + c.branches for a in m.attachments]:
        assert type(a) is Attachment and isinstance(a.name, str) and isinstance(a.text, str)
        assert a.tokens is None or (type(a.tokens) is int and a.tokens >= 0)
    assert all(m.role == "user" or not m.attachments for m in c.messages + c.branches)
    assert all(m.finish_reason in (None, "eos", "stop", "length", "cancelled", "shutdown")
               for m in c.messages + c.branches)
    assert all(isinstance(m["content"], str) for m in c.engine_messages())  # every message reads for the engine


@pytest.mark.parametrize("field, value", [("error", 5), ("tok_s", "fast"), ("tok_s", float("inf")), ("tokens", -3),
                                          ("tokens", True), ("time", "0001-01-01T00:00:00+14:00"),
                                          ("time", "9999-12-31T23:59:59-14:00"), ("interrupted", "no")])
def test_bad_message_fields_are_dropped(field, value):
    raw = json.loads(json.dumps(GOOD))
    raw["messages"][1][field] = value
    m = Conversation.from_dict(raw).messages[1]
    assert getattr(m, field) == {"error": None, "tok_s": None, "tokens": None, "time": "", "interrupted": False}[field]
    assert m.text == "a"


@pytest.mark.parametrize("field, value", [("created", [2025]), ("updated", "yesterday"), ("title", 7),
                                          ("settings", "fast"), ("snapshot", [1]), ("system_prompt", None)])
def test_bad_conversation_fields_are_dropped(field, value):
    c = Conversation.from_dict({**GOOD, field: value})
    assert getattr(c, field) == ({} if field == "settings" else None if field == "snapshot" else "")
    assert [m.text for m in c.messages] == ["q", "a"]


def test_timestamps():
    assert timestamp("2025-01-01T00:00:00+00:00") == "2025-01-01T00:00:00+00:00"
    for bad in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", 5, None, "x" * 100, "2025-13-01"):
        assert timestamp(bad) == ""


def test_mean_accepted_length_round_trips_and_a_bad_one_is_dropped():
    m = Message("assistant", "a", tokens=3, tok_s=1.0, accepted=3.25)
    assert Message.from_dict(asdict(m)).accepted == 3.25
    assert Message.from_dict({**asdict(m), "accepted": "many"}).accepted is None
    assert Message.from_dict({**asdict(m), "accepted": 0.5}).accepted is None


# --- thinking models ------------------------------------------------------------------------------

def test_reasoning_and_the_thinking_toggle_round_trip_and_go_back_to_the_template():
    c = Conversation(thinking=False)
    c.add(Message("user", "Why?"))
    c.add(Message("assistant", "Because.", reasoning="Let me think.", reasoning_tokens=4))
    again = Conversation.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again.thinking is False and again.messages[1].reasoning == "Let me think."
    assert again.messages[1].reasoning_tokens == 4
    assert again.engine_messages()[1] == {"role": "assistant", "content": "Because.",
                                          "reasoning_content": "Let me think."}
    assert "reasoning_content" not in again.engine_messages()[0]
    md = again.to_markdown()
    assert "<details><summary>Thinking</summary>" in md and md.index("Let me think.") < md.index("Because.")


@pytest.mark.parametrize("field, value", [("reasoning", 5), ("reasoning_tokens", -1), ("reasoning_tokens", "x")])
def test_bad_reasoning_fields_are_dropped(field, value):
    raw = Conversation().to_dict()
    raw["messages"] = [{"role": "assistant", "text": "t", field: value}]
    m = Conversation.from_dict(raw).messages[0]
    assert m.reasoning == "" and m.reasoning_tokens is None
    raw["thinking"] = "yes"
    assert Conversation.from_dict(raw).thinking is None


# --- format 3: own sampling, attached files; the files of format 2 ----------------------------------

def test_own_sampling_files_and_the_finish_reason_round_trip():
    c = Conversation(sampling={"temperature": 0.2, "seed": 7, "max_tokens": 64},
                     draft_attachments=[Attachment("next.md", "# later\n", 3)])
    c.add(Message("user", "Why does this fail?", attachments=[Attachment("main.py", "print(1\n", 5)]))
    c.add(Message("assistant", "A bracket is missing", tokens=64, finish_reason="length"))
    again = Conversation.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c and again.messages[1].finish_reason == "length"
    sp = again.sampling_for(SamplingParams(temperature=0.7, top_k=40, max_tokens=1024))
    assert (sp.temperature, sp.top_k, sp.seed, sp.max_tokens) == (0.2, 40, 7, 64)
    assert again.engine_messages()[0]["content"] == "File: main.py\n```py\nprint(1\n```\n\nWhy does this fail?"
    assert "## You\n\nFile: main.py\n```py\nprint(1\n```\n\nWhy does this fail?\n" in again.to_markdown()


def test_the_export_holds_each_attached_file_as_the_model_read_it():
    # A file with fences of its own, a question left inside an open fence, then the reply: each file
    # is a code block under its name, and neither the question nor the reply is read as code.
    c = Conversation()
    readme = "# Use\n```sh\nmake\n```\n"
    c.add(Message("user", "Why?\n```\nmake: *** no rule", attachments=[Attachment("README.md", readme, 9),
                                                                      Attachment("Makefile", "all:\n\techo hi", 4)]))
    c.add(Message("assistant", "No target is named so."))
    c.add(Message("user", "", attachments=[Attachment("notes.txt", "n\n")]))
    md = c.to_markdown()
    assert f"## You\n\n{c.messages[0].content()}\n```\n\n## Assistant" in md
    assert "File: README.md\n````md\n" + readme + "````" in md and "File: Makefile\n```\nall:\n\techo hi\n```" in md
    assert md.endswith("## You\n\nFile: notes.txt\n```txt\nn\n```\n")
    blocks = split_blocks(md)
    code = [b.text for b in blocks if b.kind == "code"]
    assert code == [readme.rstrip(), "all:\n\techo hi", "make: *** no rule", "n"]
    after = blocks[[b.text for b in blocks].index("make: *** no rule") + 1]
    assert after.kind == "text" and "## Assistant\n\nNo target is named so." in after.text


def test_a_message_of_files_alone_is_named_after_them():
    c = Conversation()
    c.add(Message("user", "", attachments=[Attachment("notes.txt", "n")]))
    assert c.title == "notes.txt" and c.engine_messages()[0]["content"] == "File: notes.txt\n```txt\nn\n```"


@pytest.mark.parametrize("sampling, kept", [
    ({"temperature": "hot", "top_p": 0, "top_k": 2.5, "seed": -1, "max_tokens": 0, "stop": ["x"]}, {}),
    ({"temperature": 150, "top_k": True, "seed": 2**70, "max_tokens": 1 << 40}, {}),
    ({"temperature": 0, "top_p": 1, "top_k": 0, "seed": 0, "max_tokens": 1}, None),
    ("fast", {}),
])
def test_own_sampling_values_the_engine_would_refuse_are_dropped(sampling, kept):
    c = Conversation.from_dict({**GOOD3, "sampling": sampling})
    assert c.sampling == (sampling if kept is None else kept)


def test_bad_attachments_are_dropped_and_the_message_stays():
    raw = json.loads(json.dumps(GOOD3))
    raw["messages"][0]["attachments"] = [{"name": "a"}, "b", {"name": 1, "text": "t"},
                                         {"name": "ok.txt", "text": "t", "tokens": -4}]
    raw["messages"][1]["attachments"] = [{"name": "reply.txt", "text": "replies carry no files"}]
    c = Conversation.from_dict(raw)
    assert c.messages[0].attachments == [Attachment("ok.txt", "t", None)] and c.messages[1].attachments == []


def test_a_version_2_file_written_by_the_previous_lanechat_loads_unchanged(tmp_path):
    """tests/fixtures/conversations/v2.json was written by ConversationStore.save of format 2 (with
    branches, thinking, the context's choices), before sampling, attachments and finish_reason."""
    raw = json.loads(V2.read_text())
    assert raw["format_version"] == 2 and raw["branches"]
    shutil.copy(V2, tmp_path / V2.name)
    store = ConversationStore(tmp_path)
    c = store.load("v2")
    fields = [f for f in raw if f not in ("format_version", "messages", "branches")]
    assert {f: asdict(c)[f] for f in fields} == {f: raw[f] for f in fields}
    assert [asdict(m) for m in c.messages] == [{**m, "attachments": [], "finish_reason": None}
                                               for m in raw["messages"]]
    assert [asdict(m) for m in c.branches] == [{**m, "attachments": [], "finish_reason": None}
                                               for m in raw["branches"]]
    assert c.sampling == {} and c.draft_attachments == []
    assert c.sampling_for(SamplingParams(temperature=0.3)) == SamplingParams(temperature=0.3)
    # Written back it is a file of the current version that reads the same.
    store.save(c)
    assert json.loads((tmp_path / "v2.json").read_text())["format_version"] == FORMAT_VERSION == 3
    assert store.load("v2") == c
