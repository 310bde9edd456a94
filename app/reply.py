"""One assistant reply being written: the RequestSink that fills its message and its widget, for a
new reply or for one that continues (Continue on a reply cut short: the text goes on in the same
message, its token counts add up)."""
from __future__ import annotations

import dataclasses
import secrets
import time
from typing import TYPE_CHECKING

from engine import Finished, SamplingParams

from .conversation import Message
from .engine_bridge import Ticket
from .message_view import MessageWidget

if TYPE_CHECKING:
    from .chat_tab import ChatTab

STREAM_SAVE_PERIOD_S = 2.0
METER_PERIOD_S = 0.25  # the context meter follows a streaming reply this often at most

# Tab states, shown as the tab's icon.
IDLE, WAITING, GENERATING, ERROR = "idle", "waiting", "generating", "error"


def reply_sampling(defaults: SamplingParams) -> SamplingParams:
    """Seed 0 means a fresh seed for every reply, so Regenerate gives another answer; any other
    seed is kept, and the engine then repeats a reply exactly."""
    if defaults.seed:
        return defaults
    return dataclasses.replace(defaults, seed=secrets.randbits(31) or 1)


class Reply:
    """The RequestSink of one assistant reply: events for an older reply can never touch a newer.
    `continuing`: the message holds a reply cut short, which this request goes on with."""

    def __init__(self, tab: "ChatTab", message: Message, widget: MessageWidget, continuing: bool = False) -> None:
        self.tab, self.message, self.widget = tab, message, widget
        self.continuing = continuing
        # what the message held before this request: the engine's events carry only what follows
        self._base = (message.text, message.reasoning, message.tokens or 0, message.reasoning_tokens or 0)
        self.ticket: Ticket | None = None
        self._t0: float | None = None
        self._sent = time.monotonic()
        self._saved_at = time.monotonic()
        self._metered_at = 0.0  # the meter last showed this reply's tokens so far
        self._output = False  # any text or thinking arrived
        self.live_tps = 0.0  # decode rate so far, for the total across tabs

    def on_queued(self, ahead: int, reason: str) -> None:
        reason = reason[:1].upper() + reason[1:]
        self.widget.set_status(f"{reason} ({ahead} ahead)…" if ahead else f"{reason}…")
        self.tab.set_state(WAITING)

    def on_started(self, prompt_tokens: int, reused: int = 0) -> None:
        info = self.tab.bridge.info
        if info is not None:
            self.tab.conversation.model = info.model_name
        self._t0 = time.monotonic()
        if self.continuing:
            self.widget.set_status(f"Continuing from where it stopped ({reused:,} tokens kept)…" if reused else
                                   f"Continuing (reading the conversation again: {prompt_tokens:,} tokens)…"
                                   if prompt_tokens else "Continuing…")
            self.tab.set_state(GENERATING)
            return
        self.message.prompt_tokens = prompt_tokens or None
        self.tab.update_meter()  # the prompt counts against the context from now on
        # A remote engine says how long the prompt was only at the end.
        if reused:
            self.widget.set_status(f"Resumed from snapshot ({reused} tokens); reading "
                                   f"{prompt_tokens - reused} new…")
        elif prompt_tokens:
            self.widget.set_status(f"Reading the conversation (recomputing {prompt_tokens} tokens)…")
        else:
            self.widget.set_status("Reading the conversation…")
        self.tab.set_state(GENERATING)

    def on_reasoning(self, text: str, tokens: int) -> None:
        self._first_output()
        self.message.reasoning += text
        self.message.reasoning_tokens = self._base[3] + tokens
        # the reply's tokens (thinking is some of them) before its first text, as on_text counts them
        self.message.tokens = max(self.message.tokens or 0, self._base[2] + tokens)
        self.widget.append_reasoning(text, self.message.reasoning_tokens)
        self._progress(self.message.tokens - self._base[2])

    def on_text(self, text: str, tokens: int) -> None:
        self._first_output()
        self.message.text += text
        self.message.tokens = self._base[2] + tokens
        self.widget.append(text)
        self._progress(tokens)

    def _first_output(self) -> None:
        if not self._output:
            self._output = True
            self.widget.set_status("")
            self._t0 = time.monotonic()  # tok/s counts decoding, not reading the prompt
            if not self.continuing:
                self.message.ttft = round(self._t0 - self._sent, 3)

    def _progress(self, tokens: int) -> None:
        now = time.monotonic()
        elapsed = now - (self._t0 or now)
        self.live_tps = tokens / elapsed if elapsed > 0.2 else 0.0
        self.widget.update_meta(live_tps=self.live_tps)
        if now - self._metered_at >= METER_PERIOD_S:  # a few times a second, however fast tokens come
            self._metered_at = now
            self.tab.update_meter()
        if now - self._saved_at > STREAM_SAVE_PERIOD_S:
            self._saved_at = now
            self.tab.save(background=True)

    def on_finished(self, event: Finished) -> None:
        m = self.message
        text, reasoning, tokens, reasoning_tokens = self._base
        # the engine's whole reply, what streamed joined, after what the message held
        m.text, m.tokens = text + event.text, tokens + event.tokens
        m.reasoning, m.reasoning_tokens = reasoning + event.reasoning, reasoning_tokens + event.reasoning_tokens
        m.tok_s = round(event.decode_tps, 2) if event.decode_tps else m.tok_s
        m.accepted = round(event.accepted_length, 2) if event.accepted_length else None
        if not self.continuing:
            m.prompt_tokens = event.prompt_tokens or m.prompt_tokens
        m.interrupted = event.reason in ("cancelled", "shutdown")
        m.finish_reason = event.reason
        self.tab.end_reply(self)

    def on_failed(self, message: str, too_long: bool = False) -> None:
        if too_long:
            message = self.tab.fit_context(self, message)
            if message is None:
                return
        self.message.interrupted = True
        self.message.error = message
        self.tab.end_reply(self)


def can_continue(message: Message) -> bool:
    """A reply cut short, with something written: at its max tokens, stopped, or interrupted."""
    return (message.role == "assistant" and bool(message.text or message.reasoning)
            and (message.interrupted or message.finish_reason == "length"))
