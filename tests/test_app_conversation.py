"""Conversation data: titles, the history sent to the engine, JSON round trip, Markdown export."""
import json
import math
from dataclasses import asdict
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.conversation import FORMAT_VERSION, Conversation, FormatError, Message, timestamp, title_from


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


def test_seed_zero_draws_a_fresh_seed_for_every_reply():
    from app.chat_tab import reply_sampling
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
MESSAGE_KEYS = ("role", "text", "time", "tokens", "tok_s", "interrupted", "error", "id", "parent", "reasoning",
                "reasoning_tokens", "accepted", "prompt_tokens", "ttft", "left_out")
FIELDS = [(k,) for k in GOOD2] + [(where, i, k) for where, n in (("messages", 2), ("branches", 1))
                                  for i in range(n) for k in MESSAGE_KEYS]


def put(raw, path: tuple, value) -> None:
    """Set raw[path] = value; a path inside a field an earlier change replaced does not apply."""
    for k in path[:-1]:
        if isinstance(raw, dict) and k in raw or isinstance(raw, list) and isinstance(k, int) and k < len(raw):
            raw = raw[k]
        else:
            return
    if isinstance(raw, dict) or isinstance(raw, list) and path[-1] < len(raw):
        raw[path[-1]] = value


def shown_everywhere(t: str) -> bool:
    """What the views do with a timestamp: parse it, convert it to local time, count days."""
    if t == "":
        return True
    d = datetime.fromisoformat(t).astimezone()
    return (datetime.now().astimezone().date() - d.date()).days is not None


@settings(max_examples=500, deadline=None)
@given(st.sampled_from([GOOD, GOOD2]), st.lists(st.tuples(st.sampled_from(FIELDS), ANY), min_size=1, max_size=4))
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
