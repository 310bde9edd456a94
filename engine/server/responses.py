"""The JSON the server answers with, shaped as OpenAI's: whole responses and streamed chunks."""
from __future__ import annotations

import json
import secrets
import time
from typing import Any

from .protocol import FINISH_REASONS, ApiError

DONE = b"data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying a JSON object."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
    if reasoning_tokens:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


class Shape:
    """The id, time and model every piece of one response carries, and its chat or text form."""

    def __init__(self, kind: str, model: str, include_usage: bool = False) -> None:
        self.chat = kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, reason: str, prompt_tokens: int, tokens: int, reasoning: str = "",
              reasoning_tokens: int = 0) -> dict[str, Any]:
        """A non-streamed response; a thinking model's block is the message's `reasoning_content` (vLLM's)."""
        finish = FINISH_REASONS.get(reason, reason)
        if self.chat:
            message = {"role": "assistant", "content": text, "refusal": None}
            if reasoning:
                message["reasoning_content"] = reasoning
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": usage(prompt_tokens, tokens, reasoning_tokens)}

    def chunk(self, text: str | None = None, reason: str | None = None, role: bool = False,
              reasoning: str | None = None) -> bytes:
        """A streamed piece: new text or reasoning, or the finish reason, or (chat) the assistant's role first."""
        finish = FINISH_REASONS.get(reason, reason) if reason else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            if reasoning is not None:
                delta["reasoning_content"] = reasoning
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            obj = {**self._head("text_completion"), "choices": [choice]}
        if self.include_usage:
            obj["usage"] = None  # as OpenAI: only the last chunk carries it
        return sse(obj)

    def usage_chunk(self, prompt_tokens: int, tokens: int, reasoning_tokens: int = 0) -> bytes:
        obj = self._head("chat.completion.chunk" if self.chat else "text_completion")
        return sse({**obj, "choices": [], "usage": usage(prompt_tokens, tokens, reasoning_tokens)})


def error_event(error: ApiError) -> bytes:
    """An error inside a stream that already answered 200: OpenAI's clients raise on it."""
    return sse(error.body())
