"""A tab's engine on another machine: any OpenAI-compatible server (vLLM, SGLang, llama-server,
another Lanechat), streamed with httpx on the GUI thread's asyncio loop (qasync; no threads).

RemoteEngine offers a tab what EngineBridge offers (submit / cancel / abandon reporting to a
RequestSink, `settings`, `info`), so a remote reply streams through the same UI: stop,
regenerate, tokens/s, and the server's own error message in the tab. Text reaches the sink
coalesced at the bridge's cadence, not once per network chunk.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx

from engine import Finished, LanechatError, SamplingParams, jsonfile

from .connections import RemoteConfig, api_base
from .engine_bridge import DRAIN_PERIOD_MS, Ticket, deliver

CONNECT_TIMEOUT_S = 10.0
LIST_TIMEOUT_S = 10.0


class RemoteError(LanechatError):
    """The remote engine refused, broke off, or could not be reached; the text says which."""


@dataclass(frozen=True)
class RemoteInfo:
    model_name: str
    url: str
    thinking: bool | None = None  # a remote model's thinking default is not known here: no toggle


@dataclass(frozen=True)
class RemoteSettings:
    """What a tab reads from its engine's settings: sampling defaults, and a record for the file."""
    config: RemoteConfig
    sampling: SamplingParams

    def to_dict(self) -> dict[str, Any]:
        # Never the API key: this goes into the conversation file.
        return {"remote": self.config.base_url, "model": self.config.model,
                "sampling": dataclasses.asdict(self.sampling)}


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _host(url: str) -> str:
    return urlsplit(api_base(url)).netloc or url


async def _error_message(resp: httpx.Response) -> str:
    """The server's own words: OpenAI's {"error": {"message"}}, else the start of the body."""
    raw = await resp.aread()
    try:
        err = jsonfile.loads(raw).get("error")
        message = err.get("message") if isinstance(err, dict) else err
        if isinstance(message, str) and message:
            return message
    except (ValueError, AttributeError):
        pass
    return raw.decode(errors="replace").strip()[:300] or resp.reason_phrase


async def list_models(base_url: str, api_key: str = "") -> list[str]:
    """The model ids a server offers (GET /v1/models); RemoteError saying why not."""
    url = api_base(base_url) + "/models"
    try:
        async with httpx.AsyncClient(timeout=LIST_TIMEOUT_S) as client:
            resp = await client.get(url, headers=_headers(api_key))
            if resp.status_code != 200:
                raise RemoteError(f"{_host(base_url)} answered {resp.status_code}: {await _error_message(resp)}")
            data = jsonfile.loads(resp.content).get("data")
    except httpx.HTTPError as e:
        raise RemoteError(f"Could not reach {url}: {e or type(e).__name__}") from None
    except (ValueError, AttributeError):
        raise RemoteError(f"{url} did not answer with an OpenAI model list") from None
    if not isinstance(data, list):
        raise RemoteError(f"{url} did not answer with an OpenAI model list")
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def _count(value: Any) -> int | None:
    """A token count from the server, or None for anything that is not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 53 else None


class _Reply:
    """One streaming reply: text gathered, delivered to the sink at most every drain period."""

    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket
        self.text = ""
        self.reasoning = ""
        self.tokens = 0
        self.reasoning_tokens = 0
        self.prompt_tokens = 0
        self.reason: str | None = None
        self.t_first = self.t_last = 0.0
        self._pending: list[str] = []
        self._pending_reasoning: list[str] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, text: str, reasoning: bool = False) -> None:
        """One streamed piece of the answer, or (reasoning) of its thinking block."""
        now = time.monotonic()
        self.t_first = self.t_first or now
        self.t_last = now
        self.tokens += 1  # servers stream a token per chunk; the usage at the end corrects it
        if reasoning:
            self.reasoning += text
            self.reasoning_tokens += 1
            self._pending_reasoning.append(text)
        else:
            self.text += text
            self._pending.append(text)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(DRAIN_PERIOD_MS / 1000, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending_reasoning and not self.ticket.done:
            deliver(self.ticket.sink.on_reasoning, "".join(self._pending_reasoning), self.reasoning_tokens)
        if self._pending and not self.ticket.done:
            deliver(self.ticket.sink.on_text, "".join(self._pending), self.tokens)
        self._pending.clear()
        self._pending_reasoning.clear()

    def finish(self, reason: str) -> None:
        self.flush()
        if self.ticket.done:
            return
        self.ticket.done = True
        span = self.t_last - self.t_first
        tps = (self.tokens - 1) / span if span > 0 and self.tokens > 1 else 0.0
        deliver(self.ticket.sink.on_finished, Finished(-1, reason, self.text, self.tokens, self.prompt_tokens,
                                                         0.0, tps, reasoning=self.reasoning,
                                                         reasoning_tokens=self.reasoning_tokens))

    def fail(self, message: str) -> None:
        self.flush()
        if not self.ticket.done:
            self.ticket.done = True
            deliver(self.ticket.sink.on_failed, message)


class RemoteEngine:
    """One configured remote engine; every public method is for the GUI thread."""

    def __init__(self, config: RemoteConfig, sampling: Callable[[], SamplingParams]) -> None:
        self.config = config
        self._sampling = sampling  # the app's sampling defaults, read at each reply
        self._tasks: dict[Ticket, asyncio.Task] = {}
        self._client: httpx.AsyncClient | None = None

    @property
    def settings(self) -> RemoteSettings:
        return RemoteSettings(self.config, self._sampling())

    @property
    def info(self) -> RemoteInfo:
        return RemoteInfo(self.config.model, self.config.base_url)

    @property
    def label(self) -> str:
        return f"remote: {self.config.base_url}"

    @property
    def busy(self) -> int:
        return len(self._tasks)

    def submit(self, messages: list[dict[str, str]], sampling: SamplingParams | None, sink,
               thinking: bool | None = None, snapshot: Path | None = None,
               continue_final_message: bool = False) -> Ticket:
        """As EngineBridge.submit; `snapshot` has no use here (a remote server keeps its own state).
        A reply continued is sent as vLLM's continue_final_message (SGLang and Lanechat take it too)."""
        if not self.config.model:
            raise RemoteError(f"No model is chosen for {self.config.label}: pick one in Engines and server…")
        ticket = Ticket(messages, sampling, sink, thinking, continue_final_message)
        self._tasks[ticket] = asyncio.ensure_future(self._run(ticket))
        return ticket

    def count_tokens(self, text: str) -> int | None:
        """A remote model's tokenizer is not here: None (the caller estimates)."""
        return None

    def cancel(self, ticket: Ticket) -> None:
        """Stop a reply; its sink then gets on_finished(reason="cancelled") with the text so far."""
        task = self._tasks.get(ticket)
        if task is not None:
            task.cancel()

    def abandon(self, ticket: Ticket) -> None:
        """Stop a reply and deliver nothing more (its tab is closing)."""
        ticket.done = True
        self.cancel(ticket)

    async def aclose(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # --- one reply ------------------------------------------------------------------------

    def _body(self, ticket: Ticket) -> dict[str, Any]:
        sp = ticket.sampling or self._sampling()
        # An earlier reply's thinking stays here: not every server takes reasoning_content in a message.
        messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in ticket.messages]
        body: dict[str, Any] = {"model": self.config.model, "messages": messages, "stream": True,
                                "stream_options": {"include_usage": True}, "temperature": sp.temperature,
                                "top_p": sp.top_p, "max_tokens": sp.max_tokens}
        if sp.seed:
            body["seed"] = sp.seed
        if sp.stop:
            body["stop"] = sp.stop
        # vLLM, SGLang, llama-server and Lanechat take these too; sent only when they matter.
        if sp.top_k:
            body["top_k"] = sp.top_k
        if sp.ignore_eos:
            body["ignore_eos"] = True
        if ticket.thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": ticket.thinking}
        if ticket.continue_final:
            body.update(continue_final_message=True, add_generation_prompt=False)
        return body

    async def _run(self, ticket: Ticket) -> None:
        reply = _Reply(ticket)
        host = _host(self.config.base_url)
        url = self.config.api_base + "/chat/completions"
        deliver(ticket.sink.on_queued, 0, f"connecting to {host}")
        try:
            if self._client is None:
                self._client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S))
            async with self._client.stream("POST", url, json=self._body(ticket),
                                           headers=_headers(self.config.api_key)) as resp:
                if resp.status_code != 200:
                    raise RemoteError(f"{host} answered {resp.status_code}: {await _error_message(resp)}")
                if not ticket.done:
                    deliver(ticket.sink.on_started, 0)
                await self._read(resp, reply, host)
            reply.finish(reply.reason or "stop")
        except asyncio.CancelledError:
            reply.finish("cancelled")
        except RemoteError as e:
            reply.fail(str(e))
        except httpx.ConnectError as e:
            reply.fail(f"Could not reach the remote engine at {url}: {e or 'connection refused'}")
        except httpx.HTTPError as e:
            where = "mid-reply (the text so far is kept)" if reply.text else "before the reply began"
            reply.fail(f"The connection to {host} broke {where}: {e or type(e).__name__}")
        finally:
            self._tasks.pop(ticket, None)

    @staticmethod
    async def _read(resp: httpx.Response, reply: _Reply, host: str) -> None:
        """Server-sent events to the end of the body; RemoteError on an error event or a stream cut
        short. The body is always read to its end: leaving httpx's line iterator half-way leaves it
        to be closed later by the garbage collector, outside this task, which anyio refuses."""
        error: str | None = None
        done = False
        async for line in resp.aiter_lines():
            if done or error or not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                continue
            try:
                chunk = jsonfile.loads(data)
            except ValueError:
                error = f"{host} sent a line that is not JSON: {data[:120]}"
                continue
            if not isinstance(chunk, dict):
                continue
            if chunk.get("error"):
                err = chunk["error"]
                error = f"{host} stopped this reply: {err.get('message') if isinstance(err, dict) else err}"
                continue
            choices = chunk.get("choices")
            for choice in choices if isinstance(choices, list) else []:
                delta = choice.get("delta") if isinstance(choice, dict) else None
                if not isinstance(delta, dict):
                    continue
                # vLLM and llama-server send a thinking model's block as reasoning_content (newer vLLM: reasoning)
                thought = delta.get("reasoning_content") or delta.get("reasoning")
                if isinstance(thought, str) and thought:
                    reply.add(thought, reasoning=True)
                text = delta.get("content")
                if isinstance(text, str) and text:
                    reply.add(text)
                reason = choice.get("finish_reason")
                reply.reason = reason if isinstance(reason, str) and reason else reply.reason
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                reply.tokens = _count(usage.get("completion_tokens")) or reply.tokens
                reply.prompt_tokens = _count(usage.get("prompt_tokens")) or reply.prompt_tokens
                details = usage.get("completion_tokens_details")
                if isinstance(details, dict) and _count(details.get("reasoning_tokens")) is not None:
                    reply.reasoning_tokens = details["reasoning_tokens"]
        if error is not None:
            raise RemoteError(error)
        if reply.reason is None:
            raise RemoteError(f"{host} ended the stream before the reply was finished"
                              + (" (the text so far is kept)" if reply.text else ""))
