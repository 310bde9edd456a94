"""`python -m engine bench-serve`: N concurrent streaming chat requests over HTTP against the same
load submitted in-process, for N in --streams (default 1, 4, 8, 16).

Each request has its own prompt and runs greedy with ignore_eos for --max-tokens tokens, so
every reply is known in advance: the in-process run gives it, and each HTTP reply must equal its
own (nothing lost, duplicated or mixed up). The server is `python -m engine serve` in a child
process with the same settings, the client (httpx) this process, whose own engine idles while
the HTTP cells run; the two alternate cell by cell. Every cell runs once short to warm up (CUDA
graphs are captured per batch size), then measured. Aggregate tok/s = completion
tokens / wall time from the first request sent to the last reply done; TTFT = request sent to
its first text.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from ..bench import CHATS
from ..engine import Engine
from ..errors import LanechatError
from ..events import Failed, Finished, Token
from ..settings import EngineSettings, SamplingParams

WARMUP_TOKENS = 8


@dataclass
class Cell:
    streams: int
    wall_s: float = 0.0
    tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def prompts(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"{CHATS[i % len(CHATS)]} (request {i + 1})"}] for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: with 16 samples p99 is the slowest, not an interpolation past it."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


# --- in-process -----------------------------------------------------------------------------------

def run_engine(engine: Engine, n: int, max_tokens: int) -> Cell:
    cell = Cell(n)
    sampling = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    done = threading.Event()
    lock = threading.Lock()
    texts = [""] * n
    first = [0.0] * n
    sent = [0.0] * n
    left = [n]

    def on_event(i: int, e) -> None:
        if isinstance(e, Token) and e.text:
            first[i] = first[i] or time.perf_counter()
        elif isinstance(e, (Finished, Failed)):
            with lock:
                if isinstance(e, Finished):
                    texts[i], cell.tokens = e.text, cell.tokens + e.tokens
                else:
                    cell.errors.append(e.message)
                left[0] -= 1
                if not left[0]:
                    done.set()
    t0 = time.perf_counter()
    for i, msgs in enumerate(prompts(n)):
        sent[i] = time.perf_counter()
        engine.submit(msgs, sampling, on_event=lambda e, i=i: on_event(i, e))
    done.wait()
    cell.wall_s = time.perf_counter() - t0
    cell.ttft_s = [f - s for f, s in zip(first, sent) if f]
    cell.texts = texts
    return cell


# --- over HTTP ------------------------------------------------------------------------------------

async def _one(client, url: str, model: str, msgs: list[dict], max_tokens: int, i: int, cell: Cell) -> None:
    import httpx
    body = {"model": model, "messages": msgs, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    parts: list[str] = []
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                cell.errors.append(f"request {i + 1}: HTTP {resp.status_code} {(await resp.aread())[:200]!r}")
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    cell.errors.append(f"request {i + 1}: {chunk['error'].get('message')}")
                    return
                if chunk.get("usage"):
                    cell.tokens += chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    text = choice["delta"].get("content")
                    if text:
                        if not parts:
                            cell.ttft_s.append(time.perf_counter() - sent)
                        parts.append(text)
    except httpx.HTTPError as e:
        cell.errors.append(f"request {i + 1}: {type(e).__name__}: {e}")
    cell.texts[i] = "".join(parts)


async def run_http(url: str, model: str, n: int, max_tokens: int) -> Cell:
    import httpx
    cell = Cell(n, texts=[""] * n)
    async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=n + 4)) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(_one(client, url, model, m, max_tokens, i, cell) for i, m in enumerate(prompts(n))))
        cell.wall_s = time.perf_counter() - t0
    return cell


def serve_args(s: EngineSettings) -> list[str]:
    """The `python -m engine serve` arguments that run these settings."""
    args = ["--backend", s.backend, "--parallel", str(s.parallel), "--context", str(s.context),
            "--kv-dtype", s.kv_dtype] + (["--prefill-chunk", str(s.prefill_chunk)] if s.prefill_chunk else [])
    if s.model:
        args += ["--model", s.model]
    if s.paging != "off":
        args += ["--kv-pages", str(s.page_tokens)] + (["--kv-pages-all"] if s.paging == "all" else [])
    if s.memory_gib:
        args += ["--memory-gib", str(s.memory_gib)]
    return args


def start_server(s: EngineSettings, max_waiting: int) -> tuple[subprocess.Popen, str, str]:
    """`python -m engine serve` on a free port; (process, URL, model id) once it is ready."""
    cmd = [sys.executable, "-m", "engine", "serve", *serve_args(s), "--port", "0", "--max-waiting", str(max_waiting)]
    log = tempfile.TemporaryFile("w+")  # its stderr, shown if it does not come up
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    url = ""
    for line in proc.stdout:  # ends if the server exits
        if line.startswith("serving on "):
            url = line.split()[2]
        elif line.startswith("ready: "):
            return proc, url, line.split()[1]
    proc.kill()
    code = proc.wait()
    log.seek(0)
    raise LanechatError(f"the server did not start (exit code {code}): {log.read().strip()}")


# --- the table ------------------------------------------------------------------------------------

def _ms(cell: Cell) -> str:
    return f"{percentile(cell.ttft_s, 50) * 1e3:7.0f} / {percentile(cell.ttft_s, 99) * 1e3:7.0f}"


def table(local: list[Cell], remote: list[Cell]) -> list[str]:
    lines = ["| streams | in-process tok/s | HTTP tok/s | overhead | TTFT p50 / p99 in-process (ms) "
             "| TTFT p50 / p99 HTTP (ms) | replies equal |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for a, b in zip(local, remote):
        overhead = (1 - b.tok_s / a.tok_s) * 100 if a.tok_s else math.nan
        same = sum(1 for x, y in zip(a.texts, b.texts) if x and x == y)
        lines.append(f"| {a.streams} | {a.tok_s:.1f} | {b.tok_s:.1f} | {overhead:+.1f} % | {_ms(a)} | {_ms(b)} "
                     f"| {same} / {a.streams} |")
    return lines


def main(a: argparse.Namespace, settings: EngineSettings) -> int:
    counts = a.streams
    engine = Engine(settings, log=lambda m: print(m, file=sys.stderr))
    engine.start()
    info = engine.info
    local, remote = [], []
    try:
        proc, url, model = start_server(settings, max(counts) + 1)
        try:
            for n in counts:  # in-process and HTTP cell by cell, so a busy machine skews both alike
                run_engine(engine, n, WARMUP_TOKENS)
                asyncio.run(run_http(url, model, n, WARMUP_TOKENS))
                local.append(run_engine(engine, n, a.max_tokens))
                remote.append(asyncio.run(run_http(url, model, n, a.max_tokens)))
        finally:
            proc.terminate()
            proc.wait()
    finally:
        engine.shutdown()
    print(f"bench-serve: {info.model_name} · {info.backend} · {info.device} · parallel {info.parallel} · "
          f"{a.max_tokens} tokens per request, greedy · client in this process, server in a child")
    print("\n".join(table(local, remote)))
    bad = [e for c in local + remote for e in c.errors]
    wrong = sum(1 for x, y in zip(local, remote) for p, q in zip(x.texts, y.texts) if p != q)
    lost = sum(c.streams * a.max_tokens - c.tokens for c in local + remote)
    for e in bad:
        print(f"error: {e}", file=sys.stderr)
    print(f"lost or extra tokens: {lost}; replies that differ from in-process: {wrong}; errors: {len(bad)}")
    return 0 if not bad and not wrong and not lost else 1
