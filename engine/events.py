"""What a request tells its caller, from the engine thread, through `on_event`.

Callbacks run on the engine thread: keep them short and hand off (the app buffers each event for
its GUI thread to drain).
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import LanechatError


@dataclass(frozen=True)
class Queued:
    """Waiting for a free stream (more requests than `parallel`) or for pool pages."""
    request_id: int
    ahead: int  # requests ahead of this one
    reason: str = "waiting for a free stream"


@dataclass(frozen=True)
class Started:
    request_id: int
    stream: int
    prompt_tokens: int
    reused: int = 0  # positions restored from a snapshot instead of computed


@dataclass(frozen=True)
class Token:
    """A new token and the text it completes; at the end of a request, one with token_id
    NO_TOKEN may carry text that was held back (a possible stop-string prefix)."""
    NO_TOKEN = -1

    request_id: int
    token_id: int
    text: str  # may be empty inside a multi-byte character
    tokens: int  # tokens generated so far, this one included
    reasoning: str = ""  # text of the reply's thinking block (engine.thinking), shown apart from `text`
    thinking: bool = False  # the token belongs to the thinking block


@dataclass(frozen=True)
class Finished:
    request_id: int
    reason: str  # "eos" | "stop" | "length" | "cancelled" (by its caller) | "shutdown" (the engine stopped)
    text: str  # the whole reply: what the Token events carried, joined
    tokens: int
    prompt_tokens: int
    prompt_tps: float
    decode_tps: float
    accepted_length: float = 0.0  # mean tokens per verify window with a drafter (0: none ran)
    reasoning: str = ""  # the thinking block, without its tags; `text` is the rest of the reply
    reasoning_tokens: int = 0  # of `tokens`


@dataclass(frozen=True)
class Failed:
    request_id: int
    message: str
    # Set when the engine refused the request before running it (Engine.submit checks the prompt on
    # the engine thread); its class says why, e.g. RequestError for a prompt longer than the context.
    refusal: LanechatError | None = None


Event = Queued | Started | Token | Finished | Failed
