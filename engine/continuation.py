"""Continuing an assistant turn: a chat whose last message is a reply cut short (stopped, or at its
max tokens) goes on as that same reply, not as a new turn (vLLM's `continue_final_message`).

The prompt is the chat before the reply, rendered as when the reply was written (the template's
generation prompt opens the assistant turn), followed by the reply's tokens so far. When one of
the token lists the engine still knows (a snapshot's, a prompt-cache stream end's) starts with that
prompt and its reply decodes to the reply's text, those are the generated tokens themselves: the
stream then goes on from that state exactly as the uninterrupted stream would, computing nothing
again. Otherwise the reply's text is encoded (a thinking model's block in its tags), which reads
the prompt anew and may cut the reply into other tokens than the model wrote.

A reply cut inside a character ended in U+FFFD; its continuation's text starts with that whole
character (the decoder holds its first bytes), so the text joined shows both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from .errors import RequestError
from .thinking import CLOSE, OPEN, Splitter, opens_inside


@dataclass
class Continuation:
    ids: list[int]  # the prompt and the reply so far
    reply_start: int  # where the reply begins in `ids`
    think: Splitter | None  # a thinking model's channels, as they stand after the reply so far
    exact: bool  # `ids` are the tokens the model generated (one of the known lists)


def reply_text(tokenizer, tokens: Sequence[int], inside: bool | None) -> tuple[str, str]:
    """(reasoning, content) of a reply's tokens, as the stream that wrote them told them; `inside`:
    the prompt left a think block open (None: the model does not think)."""
    detok = tokenizer.stream()
    text = "".join(detok.push(int(t)) for t in tokens) + detok.flush()
    if inside is None:
        return "", text
    think = Splitter(inside)
    think.take(text, end=True)
    return think.reasoning, think.content


def raw_reply(reasoning: str, content: str, inside: bool | None) -> str:
    """The text a model wrote for a reply's reasoning and content: the block in its tags, which
    the prompt may have opened already."""
    if inside is None:
        return content
    raw = (OPEN + "\n" if reasoning and not inside else "") + reasoning
    if content:
        raw += (f"\n{CLOSE}\n\n" if reasoning or inside else "") + content
    return raw


def continuation(tokenizer, messages: list[dict], limit: int, extra: dict[str, Any],
                 known: Iterable[Sequence[int]] = ()) -> Continuation:
    """The ids that continue the chat's last message, an assistant reply; `known`: token lists of
    streams the engine kept (prompt and reply), the first one that wrote this reply is used."""
    if not messages or messages[-1].get("role") != "assistant":
        raise RequestError("continuing a reply needs an assistant message last")
    final = messages[-1]
    reasoning, content = final.get("reasoning_content") or "", final["content"]
    text, prefix = tokenizer.chat_prompt(messages[:-1], True, limit, **extra)
    inside = opens_inside(text) if tokenizer.thinks else None
    head = np.asarray(prefix)
    for tokens in known:
        tokens = np.asarray(tokens)
        if (len(tokens) <= len(prefix) or int(tokens[-1]) in tokenizer.eos_ids
                or not np.array_equal(tokens[:len(prefix)], head)):
            continue
        if reply_text(tokenizer, tokens[len(prefix):], inside) == (reasoning, content):
            return Continuation(tokens.tolist(), len(prefix), _primed(reasoning, content, inside), True)
    reply = tokenizer.encode(raw_reply(reasoning, content, inside))
    return Continuation(prefix + reply, len(prefix), _primed(reasoning, content, inside), False)


def _primed(reasoning: str, content: str, inside: bool | None) -> Splitter | None:
    if inside is None:
        return None
    return Splitter(inside).after(raw_reply(reasoning, content, inside))
