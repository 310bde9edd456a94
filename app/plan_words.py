"""The memory plan in words people use: how many chats can be answered at once, how long each can
grow, how much memory that takes. The engine's exact plan line goes in the tooltip."""
from __future__ import annotations

from engine import Plan

_GIB, _MIB = 1 << 30, 1 << 20
WORDS_PER_TOKEN = 0.75  # English prose, roughly


def memory(n: int) -> str:
    return f"{n / _GIB:.2f} GiB" if n >= _GIB else f"{max(1, round(n / _MIB))} MiB"


def size(n: int) -> str:
    """A file's size: bytes and KiB too (a config file is not "1 MiB")."""
    if n >= _MIB:
        return memory(n)
    return f"{n} B" if n < 1024 else f"{round(n / 1024)} KiB"


def words(tokens: int) -> str:
    n = tokens * WORDS_PER_TOKEN
    return f"{round(n, -2 if n >= 1000 else -1):,.0f}"


def room_tokens(p: Plan) -> int:
    """Tokens the plan can hold for all streams together."""
    return (p.windows * p.window_pages + p.pool_pages) * p.page_tokens


def plan_sentence(p: Plan) -> str:
    """E.g. 'Up to 4 chats can be answered at once, each up to 4,096 tokens long (about 3,100
    words). Memory for them: 384 MiB.'"""
    if not p.fits:
        return f"Does not fit: {p.error or p.line}"
    each = f"up to {p.context:,} tokens long (about {words(p.context)} words)"
    if p.parallel == 1:
        text = f"One chat is answered at a time, {each}."
    else:
        text = f"Up to {p.parallel} chats can be answered at once, each {each}"
        room = room_tokens(p)
        if room < p.parallel * p.context:
            text += f", with room for {room:,} tokens in all (beyond that, the newest one waits)"
        text += "."
    text += f" Memory for {'it' if p.parallel == 1 else 'them'}: {memory(p.kv_bytes + p.state_bytes)}."
    if p.draft_tokens:
        text += f" Speculative decoding: {p.drafter}, {p.draft_tokens} drafts per step."
    if p.drafter_note:
        text += f" {p.drafter_note[0].upper()}{p.drafter_note[1:]}."
    return text


def plan_summary(p: Plan) -> str:
    """The status bar's short form: '4 chats at once · 4,096 tokens each · 384 MiB'."""
    chats = "1 chat at a time" if p.parallel == 1 else f"{p.parallel} chats at once"
    return f"{chats} · {p.context:,} tokens each · {memory(p.kv_bytes + p.state_bytes)}"
