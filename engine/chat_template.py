"""Chat templates: untrusted Jinja, parsed and rendered in a sandbox inside a worker process.

A template is code from a model file. The Jinja sandbox stops it from reaching Python internals,
but not from looping for hours (`{% for %}` over nested ranges), asking for gigabytes
(`' ' * 10**9`) or recursing until the interpreter gives up. So the engine never runs one itself:
a small worker process (this file run as a script; it imports nothing of the engine) parses and
renders with an address-space limit, and the caller waits at most LIMIT_S. A template that is too
slow, too big or broken costs one line of error (`ChatTemplateError`), never the engine; a worker
that timed out or died is replaced on the next call.

Protocol: one JSON line per request on the worker's stdin ({"template", "context"}; no context
means parse only), one JSON line per answer on its stdout ({"text"} or {"error"}). JSON with
ensure_ascii keeps newlines and lone surrogates intact inside one line.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from datetime import datetime
from typing import Any

LIMIT_S = 10.0  # per render or parse, wall clock
MAX_TEMPLATE = 1 << 20  # characters of template source
MAX_OUTPUT = 1 << 24  # characters of rendered prompt
WORKER_MEMORY = 1 << 30  # the worker's address space, bytes
_CACHED = 8  # compiled templates the worker keeps


class ChatTemplateError(Exception):
    """A template that does not parse, fails, or exceeds a limit; the message is one line."""


def one_line(text: str, most: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= most else text[: most - 3] + "..."


# --- the worker side (runs in the worker process) ---------------------------------------------------

def _environment() -> Any:
    import jinja2.ext
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        # transformers' tojson, not Jinja's: no HTML escaping, so templates render byte-identically
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    return env


def _answer(env: Any, cache: dict, request: dict) -> dict:
    source = request["template"]
    try:
        template = cache.pop(source, None) or env.from_string(source)
    except RecursionError:
        return {"error": "does not parse (nested too deeply)"}
    except MemoryError:  # Jinja folds constant expressions while it compiles
        return {"error": f"needs more than {WORKER_MEMORY >> 30} GiB of memory to compile"}
    except Exception as e:  # noqa: BLE001 - any parse failure is the template's
        return {"error": f"does not parse ({type(e).__name__}: {one_line(e)})"}
    cache[source] = template
    while len(cache) > _CACHED:
        cache.pop(next(iter(cache)))
    if request.get("context") is None:
        return {"text": ""}
    parts, size = [], 0
    try:
        for part in template.generate(**request["context"]):
            size += len(part)
            if size > MAX_OUTPUT:
                return {"error": f"renders more than {MAX_OUTPUT} characters"}
            parts.append(part)
    except MemoryError:
        return {"error": f"needs more than {WORKER_MEMORY >> 30} GiB of memory"}
    except RecursionError:
        return {"error": "failed (it recursed too deeply)"}
    except Exception as e:  # noqa: BLE001 - a template is untrusted code: any failure is one line
        return {"error": f"failed ({type(e).__name__}: {one_line(e)})"}
    return {"text": "".join(parts)}


def _serve() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    env, cache = _environment(), {}
    for line in sys.stdin.buffer:
        try:
            reply = _answer(env, cache, json.loads(line))
        except MemoryError:
            reply = {"error": f"needs more than {WORKER_MEMORY >> 30} GiB of memory"}
        except (RecursionError, ValueError) as e:
            reply = {"error": f"cannot be given these values ({type(e).__name__})"}
        sys.stdout.write(json.dumps(reply, ensure_ascii=True) + "\n")
        sys.stdout.flush()


# --- the engine side --------------------------------------------------------------------------------

class _Worker:
    """One worker process, shared by every Tokenizer in this process; calls are serialised."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def call(self, request: bytes, limit_s: float) -> dict:
        with self._lock:
            proc = self._start()
            try:
                proc.stdin.write(request)
                proc.stdin.flush()
                line = self._read_line(proc, time.monotonic() + limit_s)
            except (OSError, EOFError):
                self._stop()
                return {"error": "crashed the template renderer"}
            if line is None:
                self._stop()
                return {"error": f"took longer than {limit_s:g} s"}
            return json.loads(line)

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            # -I: no user site, no environment variables, no current folder on the path
            self._proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
            self._buffer = b""
        return self._proc

    def _read_line(self, proc: subprocess.Popen, deadline: float) -> bytes | None:
        fd = proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EOFError
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop()

    def forget(self) -> None:
        """In a forked child: the worker belongs to the parent; this process starts its own."""
        self._lock = threading.Lock()
        self._proc = None


_worker = _Worker()
atexit.register(_worker.close)
os.register_at_fork(after_in_child=_worker.forget)


def _call(source: str, context: dict | None, limit_s: float) -> str:
    if not isinstance(source, str):
        raise ChatTemplateError(f"must be text, not {type(source).__name__}")
    if len(source) > MAX_TEMPLATE:
        raise ChatTemplateError(f"is longer than {MAX_TEMPLATE} characters")
    try:
        request = json.dumps({"template": source, "context": context}, ensure_ascii=True) + "\n"
    except (TypeError, ValueError, RecursionError) as e:
        raise ChatTemplateError(f"cannot be given these values ({one_line(e)})") from None
    reply = _worker.call(request.encode("ascii"), limit_s)
    if "error" in reply:
        raise ChatTemplateError(reply["error"])
    return reply["text"]


def check(source: str, limit_s: float = LIMIT_S) -> None:
    """Parse a template; ChatTemplateError says why it cannot be used."""
    _call(source, None, limit_s)


def render(source: str, context: dict[str, Any], limit_s: float = LIMIT_S) -> str:
    """The rendered text; ChatTemplateError when the template fails or exceeds a limit.
    `context` must be JSON data (strings, numbers, lists, dicts), as chat messages are."""
    return _call(source, context, limit_s)


if __name__ == "__main__":
    _serve()
