"""Conversation data: titles, the history sent to the engine, JSON round trip, Markdown export."""
import pytest

from app.conversation import FORMAT_VERSION, Conversation, FormatError, Message, title_from


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
