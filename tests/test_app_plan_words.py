"""The plan in words people use: chats at once, how long each, memory; the exact line stays the
engine's (the seed's words first, later additions after " · ")."""
from app.plan_words import memory, plan_sentence, plan_summary, size, words
from engine import EngineSettings, plan


def test_a_plan_with_room_for_everyone():
    p = plan(EngineSettings(model="synthetic:llama3-8b", parallel=4, context=4096, paging="off", memory_gib=8))
    assert plan_sentence(p) == ("Up to 4 chats can be answered at once, each up to 4,096 tokens long (about 3,100 "
                                f"words). Memory for them: {memory(p.kv_bytes)}.")
    assert plan_summary(p) == f"4 chats at once · 4,096 tokens each · {memory(p.kv_bytes)}"
    assert p.line.startswith("plan: 4 windows of 4096 tokens")


def test_a_pool_smaller_than_every_chat_at_full_length_says_so():
    p = plan(EngineSettings(model="synthetic:llama3-8b", parallel=8, context=16384, paging="all", memory_gib=4))
    text = plan_sentence(p)
    assert text.startswith("Up to 8 chats can be answered at once, each up to 16,384 tokens long")
    assert f"with room for {p.pool_pages * p.page_tokens:,} tokens in all" in text and "newest one waits" in text


def test_one_stream_and_a_plan_that_does_not_fit():
    one = plan(EngineSettings(model="synthetic:llama3-8b", parallel=1, context=2048, memory_gib=8))
    assert plan_sentence(one).startswith("One chat is answered at a time, up to 2,048 tokens long")
    bad = plan(EngineSettings(model="synthetic:llama3-8b", parallel=8, context=16384, memory_gib=0.001))
    assert not bad.fits and plan_sentence(bad).startswith("Does not fit: a memory budget of 0.001 GiB is too small")


def test_units():
    assert memory(3 << 20) == "3 MiB" and memory(3 << 30) == "3.00 GiB" and memory(10) == "1 MiB"
    assert words(512) == "380" and words(4096) == "3,100"
    assert size(612) == "612 B" and size(4300) == "4 KiB" and size(55 << 20) == "55 MiB" and size(3 << 30) == "3.00 GiB"


def test_additions_follow_the_seeds_line_after_a_dot():
    p = plan(EngineSettings(model="synthetic:qwen3.5-27b", parallel=8, context=16384, paging="off", memory_gib=40))
    head, _, extra = p.line.partition(" · ")
    assert head == "plan: 8 windows of 16384 tokens (8.00 GiB), no pages" and extra.startswith("recurrent state ")
