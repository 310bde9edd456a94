"""The OpenAI-compatible HTTP API on aiohttp: each request is one more stream of the slot's engine.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health. Every
answer that is not a success is OpenAI's error JSON. Order of refusals: API key (401), body size
(413, from Content-Length before anything is read), JSON and fields (400), no engine (503),
unknown model (404), waiting queue full (429), prompt over the context (400
context_length_exceeded). A client that disconnects cancels its request at once.
"""
from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
from typing import Any, Awaitable, Callable

from aiohttp import web

from ..engine import Engine
from ..errors import ContextLengthError, LanechatError
from ..events import Failed, Finished, Started, Token
from .protocol import ApiError, Job, bad, parse_chat, parse_completion, unavailable
from .responses import DONE, Shape, error_event
from .slot import EngineSlot
from .streams import Ended, RequestStream

log = logging.getLogger(__name__)

MAX_BODY = 4 << 20
MAX_WAITING = 64
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(obj: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(obj, status=status, dumps=functools.partial(json.dumps, ensure_ascii=False))


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


class OpenAIServer:
    """The routes and the streams in flight; `app()` is the aiohttp application to run."""

    def __init__(self, slot: EngineSlot, api_key: str | None = None, max_body: int = MAX_BODY,
                 max_waiting: int = MAX_WAITING) -> None:
        self.slot = slot
        self.api_key = api_key or None
        self.max_body = max_body
        self.max_waiting = max_waiting
        self.open: set[RequestStream] = set()
        self.counts = {"finished": 0, "cancelled": 0, "failed": 0}  # requests that reached the engine
        self.loop: asyncio.AbstractEventLoop | None = None
        slot.on_gone(self._engine_gone)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._auth], client_max_size=self.max_body)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.on_startup.append(self._bind_loop)
        return app

    async def _bind_loop(self, _app: web.Application) -> None:
        self.loop = asyncio.get_running_loop()

    # --- middlewares ----------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as e:
            return json_response(e.body(), e.status)
        except web.HTTPRequestEntityTooLarge:
            return json_response(self._too_large().body(), 413)
        except web.HTTPException as e:  # aiohttp's own: unknown URL, wrong method
            code = "unknown_url" if e.status == 404 else None
            msg = f"{e.reason}: {request.method} {request.path}"
            return json_response(ApiError(e.status, msg, code=code).body(), e.status)
        except Exception as e:  # a bug must still answer in JSON, and the others keep being served
            log.exception("request failed")
            error = ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")
            return json_response(error.body(), 500)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.api_key is not None:
            given = request.headers.get("Authorization", "")
            token = given[7:] if given[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                raise ApiError(401, "Incorrect or missing API key (send Authorization: Bearer <key>)",
                               code="invalid_api_key")
        if request.content_length is not None and request.content_length > self.max_body:
            raise self._too_large()
        return await handler(request)

    def _too_large(self) -> ApiError:
        return ApiError(413, f"request body over the limit of {self.max_body} bytes", code="request_too_large")

    # --- routes ---------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        engine, reason = self.slot.get()
        if engine is None:
            return json_response({"status": "unavailable", "reason": reason}, 503)
        u = engine.usage()
        return json_response({"status": "ok", "model": engine.info.model_name, "active": u.active,
                              "waiting": u.waiting, "http_streams": len(self.open), "requests": self.counts})

    async def models(self, request: web.Request) -> web.Response:
        engine = self._engine()
        info = engine.info
        return json_response({"object": "list", "data": [
            {"id": info.model_name, "object": "model", "created": 0, "owned_by": "lanechat",
             "context_length": info.context}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        engine = self._engine()
        return await self._run(request, engine, parse_chat(body, engine.settings.sampling, engine.settings.context))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        engine = self._engine()
        job = parse_completion(body, engine.settings.sampling, engine.settings.context)
        return await self._run(request, engine, job)

    # --- a request's life -----------------------------------------------------------------

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            return json.loads(raw, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as e:
            raise bad(f"the request body is not valid JSON ({e})") from None

    def _engine(self) -> Engine:
        engine, reason = self.slot.get()
        if engine is None:
            raise unavailable(f"no model is ready: {reason}")
        return engine

    def _waiting(self, engine: Engine) -> int:
        own = sum(1 for s in self.open if s.engine is engine and not s.started)
        return max(own, engine.usage().waiting)

    async def _run(self, request: web.Request, engine: Engine, job: Job) -> web.StreamResponse:
        served = engine.info.model_name
        if job.model is not None and job.model != served:
            raise ApiError(404, f"The model {job.model!r} does not exist here; this server runs {served!r}",
                           param="model", code="model_not_found")
        if self._waiting(engine) >= self.max_waiting:
            raise ApiError(429, f"{self.max_waiting} requests are already waiting for a free stream; retry later",
                           type="rate_limit_exceeded", code="rate_limit_exceeded")
        stream = RequestStream(asyncio.get_running_loop(), engine)
        self.open.add(stream)
        try:
            await self._submit(stream, job)
            first = await stream.next_events()
            self._raise_if_refused(first[0], job)
            if job.stream:
                return await self._sse(request, job, stream, first, served)
            return await self._whole(job, stream, first, served)
        finally:
            self.open.discard(stream)
            if stream.rid is not None:
                self.counts[stream.outcome] += 1
            if not stream.finished and stream.rid is not None:
                engine.cancel(stream.rid)  # the client went away, or the stream was ended

    async def _submit(self, stream: RequestStream, job: Job) -> None:
        """Tokenize and queue off the loop (a long chat template must not stall the other streams)."""
        engine = stream.engine

        def submit() -> int:
            ids = job.prompt_ids if job.prompt is None else engine.encode(job.prompt)
            return engine.submit(job.messages, job.sampling, on_event=stream.push, prompt_ids=ids,
                                 thinking=job.thinking, continue_final_message=job.continue_final)

        def cancel_late(f: asyncio.Future) -> None:
            if f.exception() is None:
                engine.cancel(f.result())
        future = asyncio.get_running_loop().run_in_executor(None, submit)
        try:
            stream.rid = await asyncio.shield(future)
        except asyncio.CancelledError:  # the client left while the request was being queued
            future.add_done_callback(cancel_late)
            raise
        except LanechatError as e:  # refused before queueing: the sampling settings, a token id, ...
            raise bad(str(e)) from None

    @staticmethod
    def _raise_if_refused(event: object, job: Job | None = None) -> None:
        """A request the engine refused before any work (its first event) is the client's error."""
        if isinstance(event, Failed):
            if isinstance(event.refusal, ContextLengthError):
                field = "messages" if job is None or job.kind == "chat" else "prompt"
                raise bad(str(event.refusal), field, "context_length_exceeded")
            if event.refusal is not None:  # the chat template, the prompt ids, ...
                raise bad(str(event.refusal))
            raise ApiError(500, event.message, type="server_error")
        if isinstance(event, Ended):
            raise event.error

    async def _whole(self, job: Job, stream: RequestStream, events: list, served: str) -> web.Response:
        while True:
            for e in events:
                if isinstance(e, Finished):
                    if e.reason == "shutdown":
                        raise unavailable("the engine stopped before the reply was finished")
                    shape = Shape(job.kind, served)
                    return json_response(shape.whole(e.text, e.reason, e.prompt_tokens, e.tokens, e.reasoning,
                                                     e.reasoning_tokens))
                if isinstance(e, Failed):
                    raise ApiError(500, e.message, type="server_error")
                if isinstance(e, Ended):
                    raise e.error
            events = await stream.next_events()

    async def _sse(self, request: web.Request, job: Job, stream: RequestStream, events: list,
                   served: str) -> web.StreamResponse:
        shape = Shape(job.kind, served, job.include_usage)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        out = [shape.chunk(role=True)] if shape.chat else []
        prompt_tokens = 0
        try:
            while True:
                for e in events:
                    if isinstance(e, Started):
                        prompt_tokens = e.prompt_tokens
                    elif isinstance(e, Token):
                        if e.reasoning and shape.chat:
                            out.append(shape.chunk(reasoning=e.reasoning))
                        if e.text:
                            out.append(shape.chunk(e.text))
                    elif isinstance(e, Finished):
                        if e.reason == "shutdown":
                            out += [error_event(unavailable("the engine stopped before the reply was finished")),
                                    DONE]
                        else:
                            out.append(shape.chunk(reason=e.reason))
                            if shape.include_usage:
                                out.append(shape.usage_chunk(e.prompt_tokens or prompt_tokens, e.tokens,
                                                             e.reasoning_tokens))
                            out.append(DONE)
                    elif isinstance(e, (Failed, Ended)):
                        error = e.error if isinstance(e, Ended) else ApiError(500, e.message, type="server_error")
                        out += [error_event(error), DONE]
                if out:
                    await resp.write(b"".join(out))
                    out.clear()
                if events and RequestStream.last(events[-1]):
                    break
                events = await stream.next_events()
            await resp.write_eof()
        except ConnectionResetError:  # the client left mid-stream; _run's finally cancels the request
            pass
        return resp

    # --- the engine going away ------------------------------------------------------------

    def _engine_gone(self, engine: Engine, why: str) -> None:
        """Any thread: the slot let go of `engine`; its streams end now with a 503 error."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self.end_streams, engine, why)
        except RuntimeError:
            pass

    def end_streams(self, engine: Engine | None, why: str) -> None:
        """Loop thread: end the open streams (of `engine`, or all) with a 503 error event."""
        for stream in list(self.open):
            if engine is None or stream.engine is engine:
                stream.end(unavailable(why))
