"""`python -m engine bench-resume`: time to first token of a follow-up turn after a long history.

For each history length H: a first turn (a prompt of H - 16 tokens and a 16-token reply) runs on a
scheduler with the prompt cache, and its snapshot is written to a file. The follow-up (the history
plus a short new turn) is then timed three ways, each on the same weights:

- cold: a scheduler without cache recomputes the whole history;
- cache hit: the first turn's scheduler, whose prompt cache holds the stream's end;
- disk: a fresh scheduler, the snapshot file read back (warm page cache) and restored, then only
  the new turn computed (the time includes reading and checking the file).

The restore (loading the file, then writing it into a lane, timed apart) has a target of 50 ms
plus the snapshot's bytes at 2 GB/s. The load is split into reading the file, hashing it (xxh3)
and landing it in the backend's memory (on the GPU: the copies from page-locked staging, waited
for at the end); `write` is the copy of the landed arrays into the lane's pages.
"""
from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from .bench import build_runner
from .engine import run_to_end
from .gates import FOLLOW_UP
from .kv import snapshots
from .settings import EngineSettings, SamplingParams

REPLY = 16
TARGET_BASE_S, TARGET_BPS = 0.05, 2e9


def first_token_s(runner, sched, s: EngineSettings, ids: list[int], resume=None) -> tuple[float, int]:
    """Seconds from submitting a prompt to its first token, and the positions computed for it."""
    seq = runner.sequence(1, s, None, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
                          lambda e: None, ids, resume=resume)
    before = sched.prompt_positions
    runner.backend.synchronize()
    t = time.perf_counter()
    run_to_end(sched, [seq])
    runner.backend.synchronize()
    return time.perf_counter() - t, sched.prompt_positions - before


def restore_s(runner, sched, snap) -> float:
    """Seconds to write a snapshot into a fresh lane (what a resume adds to reading the file)."""
    lane = sched.lanes.acquire()
    try:
        if not sched.lanes.ensure(lane, snap.cache.n + 1):
            raise SystemExit("error: the pool cannot hold the history; raise --memory-gib")
        runner.backend.synchronize()
        t = time.perf_counter()
        sched.cache.write(lane, snap.cache)
        runner.backend.synchronize()
        return time.perf_counter() - t
    finally:
        sched.lanes.release(lane)


def main(a) -> int:
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    paging = "all" if a.kv_pages_all else ("pages" if a.kv_pages else "off")
    s = EngineSettings(model=a.model, backend=a.backend, parallel=a.parallel, context=a.context,
                       kv_dtype=a.kv_dtype, paging=paging, page_tokens=a.kv_pages or 256, memory_gib=a.memory_gib,
                       prefill_chunk=a.prefill_chunk, prompt_cache_gib=0.0).validate()
    runner = build_runner(a, s, log)
    s = s.with_chunk(runner.backend.prompt_chunk)
    cfg = runner.loaded.config
    cached = replace(s, prompt_cache_gib=a.prompt_cache_gib)
    follow = runner.tokenizer.encode(FOLLOW_UP)
    hi = min(cfg.vocab, 272) if runner.loaded.format == "synthetic" else cfg.vocab
    rng = np.random.default_rng(0)
    print(f"bench-resume: {runner.loaded.name} on {runner.backend.name} ({runner.backend.device}), "
          f"{s.kv_dtype} KV, {paging} paging, context {s.context}, prefill chunk {s.prefill_chunk}")
    rows = ["history\tcold s\tcache hit s\tdisk s\tsnapshot GB\tload ms\tread ms\tcheck ms\tland ms\twrite ms\t"
            "restore ms\ttarget ms\tcomputed (cold/hit/disk)"]
    with tempfile.TemporaryDirectory(prefix="lanechat-bench-") as tmp:
        warm = runner.scheduler(s)
        first_token_s(runner, warm, s, rng.integers(16, hi, 300).tolist())  # kernels compile once
        for H in a.history:
            if H + len(follow) + 2 > s.context:
                rows.append(f"{H}\tskipped: beyond --context {s.context}")
                continue
            sched = runner.scheduler(cached)
            if sched.prompt_cache is None:
                raise SystemExit("error: the prompt cache needs pool pages (--kv-pages) and --prompt-cache-gib > 0")
            prompt = rng.integers(16, hi, H - REPLY).tolist()
            turn = runner.sequence(1, cached, None, SamplingParams(temperature=0, max_tokens=REPLY, ignore_eos=True),
                                   lambda e: None, prompt, snapshot_at_end=True)
            run_to_end(sched, [turn])
            snap = sched.snapshots.pop(1)
            ids = turn.tokens + follow
            cold_s, cold_n = first_token_s(runner, runner.scheduler(s), s, ids)
            hit_s, hit_n = first_token_s(runner, sched, cached, ids)
            del sched
            path = Path(tmp) / f"{H}.kv"
            snapshots.save(path, snap, runner.fingerprint, s.page_tokens)
            size = path.stat().st_size
            fresh = runner.scheduler(s)
            split: dict[str, float] = {}
            t = time.perf_counter()
            back = snapshots.load(path, runner.fingerprint, s.kv_dtype, runner.backend.landing(), split)
            read_s = time.perf_counter() - t
            write_s = restore_s(runner, fresh, back)
            disk_s, disk_n = first_token_s(runner, fresh, s, ids, resume=back)
            disk_s += read_s
            target = TARGET_BASE_S + size / TARGET_BPS
            parts = "\t".join(f"{1e3 * split[k]:.0f}" for k in ("read", "check", "land"))
            rows.append(f"{H}\t{cold_s:.3f}\t{hit_s:.3f}\t{disk_s:.3f}\t{size / 1e9:.3f}\t{1e3 * read_s:.0f}\t{parts}\t"
                        f"{1e3 * write_s:.0f}\t{1e3 * (read_s + write_s):.0f}\t{1e3 * target:.0f}\t"
                        f"{cold_n}/{hit_n}/{disk_n}")
            log(f"bench-resume: history {H} done")
    print("\n".join(rows))
    return 0
