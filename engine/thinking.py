"""Thinking models: a reply's `<think>…</think>` block as its own channel (vLLM's `reasoning_content`).

A template either opens the block itself (Qwen3.5 ends the prompt with `<think>\\n` when thinking is
on) or leaves it to the model (Qwen3 writes `<think>` first); `opens_inside` reads which from the
rendered prompt. `Splitter` then takes the reply's text as it becomes final and hands back
(reasoning, content) deltas, holding back only what could still be a tag: a partial `</think>`,
the newlines around the block that templates add and strip again, and at the very start of a
reply a partial `<think>`. An opening tag counts only there; later, `<think>` is plain text.
"""
from __future__ import annotations

from typing import Callable

OPEN, CLOSE = "<think>", "</think>"
BEFORE, INSIDE, AFTER, OUTSIDE = "before", "inside", "after", "outside"


def supports(chat_template: str) -> bool:
    """Whether a chat template knows thinking blocks (it renders or strips `</think>`)."""
    return CLOSE in chat_template


def opens_inside(prompt: str) -> bool:
    """Whether a rendered prompt leaves a think block open for the model to continue."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


def template_default(render: Callable[..., str]) -> bool | None:
    """The template's own `enable_thinking` default: True or False, or None when the flag changes
    nothing. `render(messages, **extra)` renders a chat with the generation prompt."""
    chat = [{"role": "user", "content": "Hi"}]
    plain, on, off = render(chat), render(chat, enable_thinking=True), render(chat, enable_thinking=False)
    if on == off:
        return None
    return plain == on


def _partial(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class Splitter:
    """Final reply text in, (reasoning, content) deltas out; `tokens` counts the thinking tokens."""

    def __init__(self, inside: bool):
        self.state = INSIDE if inside else BEFORE
        self._buf = ""
        self._lead = inside  # newlines right after the opening tag are the template's
        self.tokens = 0
        self.reasoning = ""  # what `take` handed out, in each channel
        self.content = ""

    @property
    def thinking(self) -> bool:
        return self.state == INSIDE

    def take(self, text: str, end: bool = False) -> tuple[str, str, bool]:
        """One token's final text (`end`: what was held back when the reply ends, no token): the
        reasoning and content it releases, kept in `reasoning` and `content`, and whether it was a
        thinking token."""
        counted = self.tokens
        if end:
            reasoning, content = self.feed(text)
            more = self.finish()
            reasoning, content = reasoning + more[0], content + more[1]
        else:
            reasoning, content = self.push(text)
        self.reasoning += reasoning
        self.content += content
        return reasoning, content, self.tokens > counted

    def push(self, text: str) -> tuple[str, str]:
        """One token's final text; the reasoning and content it releases (either may be empty)."""
        was = self.state
        out = self.feed(text)
        if INSIDE in (was, self.state):  # the tags themselves count as thinking
            self.tokens += 1
        return out

    def after(self, text: str) -> "Splitter":
        """Stand where a reply stands after `text`, all of it already delivered (what the end of
        a reply releases included): a continuation of the reply then gives only what follows."""
        self.feed(text)
        self._buf = ""
        return self

    def finish(self) -> tuple[str, str]:
        """The reply ended: whatever was held back, in the channel it was in."""
        rest, self._buf = self._buf, ""
        if self.state == INSIDE:
            return rest.lstrip("\n") if self._lead else rest, ""
        return "", rest if self.state in (BEFORE, OUTSIDE) else rest.lstrip("\n")

    def feed(self, text: str) -> tuple[str, str]:
        """`push` without counting a token (text held back until the end of a reply)."""
        self._buf += text
        reasoning, content = [], []
        while self._buf:
            if self.state == BEFORE:
                head = self._buf.lstrip()
                if head.startswith(OPEN):
                    self._buf, self.state, self._lead = head[len(OPEN):], INSIDE, True
                elif OPEN.startswith(head):
                    break  # whitespace or a partial opening tag: wait for more
                else:
                    self.state = OUTSIDE
            elif self.state == OUTSIDE:
                content.append(self._buf)
                self._buf = ""
            elif self.state == AFTER:
                self._buf = self._buf.lstrip("\n")
                if self._buf:
                    self.state = OUTSIDE
            else:
                if self._lead:
                    self._buf = self._buf.lstrip("\n")
                    if not self._buf:
                        break
                    self._lead = False
                at = self._buf.find(CLOSE)
                if at >= 0:
                    reasoning.append(self._buf[:at].rstrip("\n"))
                    self._buf, self.state = self._buf[at + len(CLOSE):], AFTER
                    continue
                cut = len(self._buf) - _partial(self._buf, CLOSE)
                shown = self._buf[:cut].rstrip("\n")  # newlines before the closing tag are the template's
                reasoning.append(shown)
                self._buf = self._buf[len(shown):]
                break
        return "".join(reasoning), "".join(content)
