"""OpenAI request bodies in, what the engine runs out; errors in OpenAI's JSON shape. No HTTP here.

Fields OpenAI defines and we cannot honour (n > 1, tools, logprobs, ...) are refused with a 400
naming the field; fields nobody defines are ignored, as OpenAI does. `top_k` and `ignore_eos` are
accepted as vLLM and llama-server accept them. Omitted sampling fields take the engine's defaults.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from ..settings import SamplingParams

MAX_STOP = 4  # as OpenAI
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


@dataclass
class ApiError(Exception):
    """An answer with an error status, in the shape OpenAI's clients parse."""
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, type="server_error", code="engine_unavailable")


@dataclass
class Job:
    """One request as the engine will run it."""
    kind: str  # "chat" | "completion"
    model: str | None
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False
    messages: list[dict[str, str]] | None = None
    thinking: bool | None = None  # chat_template_kwargs.enable_thinking (None: the model's default)
    continue_final: bool = False  # vLLM's continue_final_message: go on with the last (assistant) message
    prompt: str | None = None  # a completion's text, tokenized by the engine
    prompt_ids: list[int] | None = field(default=None, repr=False)


def parse_chat(body: Any, defaults: SamplingParams, context: int) -> Job:
    """A /v1/chat/completions body; ApiError(400) naming the field that is wrong."""
    body = _object(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("messages must be a non-empty array of {role, content} objects", "messages")
    messages = [_message(m, i) for i, m in enumerate(raw)]
    for name in ("tools", "functions"):
        if body.get(name):
            raise bad(f"{name} are not supported by this server", name)
    if body.get("logprobs"):
        raise bad("logprobs are not supported by this server", "logprobs")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type", "text") != "text"):
        raise bad("only the text response format is supported", "response_format")
    job = _common(body, defaults, context, "chat")
    job.messages = messages
    job.thinking = _thinking(body.get("chat_template_kwargs"))
    job.continue_final = _continue_final(body, messages)
    return job


def _continue_final(body: dict, messages: list[dict]) -> bool:
    """vLLM's continue_final_message (with add_generation_prompt false): the reply goes on with the
    last message, which must be the assistant's."""
    go_on, prompt = body.get("continue_final_message", False), body.get("add_generation_prompt", True)
    for name, value in (("continue_final_message", go_on), ("add_generation_prompt", prompt)):
        if not isinstance(value, bool):
            raise bad(f"{name} must be true or false", name)
    if go_on and prompt:
        raise bad("continue_final_message needs add_generation_prompt false", "add_generation_prompt")
    if go_on and messages[-1]["role"] != "assistant":
        raise bad("continue_final_message needs an assistant message last", "messages")
    return go_on


def _thinking(kwargs: Any) -> bool | None:
    """vLLM's chat_template_kwargs: enable_thinking is the one this server passes on."""
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        raise bad("chat_template_kwargs must be an object", "chat_template_kwargs")
    value = kwargs.get("enable_thinking")
    if value is not None and not isinstance(value, bool):
        raise bad("chat_template_kwargs.enable_thinking must be true or false", "chat_template_kwargs.enable_thinking")
    return value


def parse_completion(body: Any, defaults: SamplingParams, context: int) -> Job:
    """A /v1/completions body: a prompt string, or one list of token ids."""
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    job = _common(body, defaults, context, "completion")
    if isinstance(prompt, str):
        if not prompt:
            raise bad("prompt must not be empty", "prompt")
        job.prompt = _utf8(prompt, "prompt")
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        job.prompt_ids = [int(t) for t in prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad("one prompt per request: this server does not batch prompts", "prompt")
    else:
        raise bad("prompt must be a non-empty string or array of token ids", "prompt")
    if body.get("echo"):
        raise bad("echo is not supported by this server", "echo")
    if body.get("suffix"):
        raise bad("suffix is not supported by this server", "suffix")
    if body.get("logprobs") is not None:
        raise bad("logprobs are not supported by this server", "logprobs")
    if body.get("best_of") not in (None, 1):
        raise bad("best_of must be 1 on this server", "best_of")
    return job


# --- fields ---------------------------------------------------------------------------------------

def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    return body


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _message(m: Any, i: int) -> dict[str, str]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad(f"{where} must be an object with role and content", where)
    role = m.get("role")
    if role not in ROLES:
        known = ", ".join(ROLES)
        raise bad(f"{where}.role {role!r} is not a role this server knows ({known})", f"{where}.role")
    content = m.get("content")
    if content is None and role == "assistant":
        content = ""
    elif isinstance(content, list):
        content = "".join(_text_part(p, f"{where}.content[{j}]") for j, p in enumerate(content))
    elif not isinstance(content, str):
        raise bad(f"{where}.content must be a string or an array of text parts", f"{where}.content")
    out = {"role": ROLES[role], "content": _utf8(content, f"{where}.content")}
    reasoning = m.get("reasoning_content")
    if reasoning is not None and role == "assistant":  # an earlier reply's thinking: the template keeps or drops it
        if not isinstance(reasoning, str):
            raise bad(f"{where}.reasoning_content must be a string", f"{where}.reasoning_content")
        out["reasoning_content"] = _utf8(reasoning, f"{where}.reasoning_content")
    return out


def _utf8(text: str, where: str) -> str:
    """JSON may escape lone surrogates (\\ud800), which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(f"{where} is not valid Unicode text (a lone surrogate)", where) from None
    return text


def _text_part(part: Any, where: str) -> str:
    if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
        raise bad(f"{where}: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported", where)
    return part["text"]


def _common(body: dict[str, Any], defaults: SamplingParams, context: int, kind: str) -> Job:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model must be a string", "model")
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise bad("n must be 1: this server writes one choice per request", "n")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad("stream must be true or false", "stream")
    include_usage = _stream_options(body.get("stream_options"), stream)
    return Job(kind, model, _sampling(body, defaults, context), stream, include_usage)


def _stream_options(opts: Any, stream: bool) -> bool:
    if opts is None:
        return False
    if not stream:
        raise bad("stream_options is only allowed when stream is true", "stream_options")
    if not isinstance(opts, dict):
        raise bad("stream_options must be an object", "stream_options")
    usage = opts.get("include_usage", False)
    if not isinstance(usage, bool):
        raise bad("stream_options.include_usage must be true or false", "stream_options.include_usage")
    return usage


def _sampling(body: dict[str, Any], defaults: SamplingParams, context: int) -> SamplingParams:
    def number(name: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
        v = body.get(name)
        if v is None:
            return None
        if not _is_number(v) or v < lo or v > hi or (lo_open and v == lo):
            raise bad(f"{name} must be a number in {'(' if lo_open else '['}{lo:g}, {hi:g}]", name)
        return float(v)

    temperature = number("temperature", 0, 2)
    top_p = number("top_p", 0, 1, lo_open=True)
    max_tokens = body.get("max_completion_tokens")
    name = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, name = body.get("max_tokens"), "max_tokens"
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise bad(f"{name} must be a positive integer", name)
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < -1):
        raise bad("top_k must be an integer >= 0 (-1 or 0: off)", "top_k")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not -(1 << 63) <= seed < (1 << 64)):
        raise bad("seed must be a 64-bit integer", "seed")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad("ignore_eos must be true or false", "ignore_eos")
    return SamplingParams(
        temperature=defaults.temperature if temperature is None else temperature,
        top_p=defaults.top_p if top_p is None else top_p,
        top_k=defaults.top_k if top_k is None else max(top_k, 0),
        # Without a limit a reply may run to the end of the context, where the engine stops it.
        max_tokens=context if max_tokens is None else max_tokens,
        # No seed: a fresh one, so repeated requests differ as they do on OpenAI.
        seed=secrets.randbits(63) if seed is None else seed,
        stop=_stop(body.get("stop")),
        ignore_eos=ignore_eos,
    )


def _stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad("stop must be a string or an array of strings", "stop")
    stop = [_utf8(s, "stop") for s in stop]
    if len(stop) > MAX_STOP:
        raise bad(f"stop takes at most {MAX_STOP} strings", "stop")
    return [s for s in stop if s]
