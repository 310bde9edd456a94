"""bench-start: how long from launch (or Apply) to a model that answers, stage by stage.

One start is measured in a fresh process per run (`--runs N`: the first reads the files cold or
warm as the page cache has them, the later ones warm): the backend, reading the weights, preparing
them on the device, the KV pool, the decode graphs of every batch size (captured at start on the
GPU), which together are "ready" (what the app waits for), then a first reply: its first token
after a short prompt, its first decode step and a steady decode step, whose difference ("first-step
stall") is what a stream joining would wait beyond a step: about nothing once the graphs are warm.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

from .engine import Runner
from .events import Token
from .settings import EngineSettings, SamplingParams

STAGES = ("backend", "weights", "prepare", "kv", "graphs", "ready", "first token", "first decode step",
          "steady decode step", "first-step stall")
PROMPT_TOKENS = 16
STEADY_STEPS = 8


def measure(settings: EngineSettings, log=print) -> dict[str, float]:
    """Seconds per stage of one start in this process."""
    t0 = time.perf_counter()
    runner = Runner(settings, log=log)
    t = time.perf_counter()
    sched = runner.scheduler(settings)
    runner.backend.synchronize()
    out = dict(runner.timings)
    out["kv"] = time.perf_counter() - t
    t = time.perf_counter()
    sched.warm_decode()
    runner.backend.synchronize()
    out["graphs"] = time.perf_counter() - t
    out["ready"] = time.perf_counter() - t0
    vocab = runner.loaded.config.vocab
    ids = [(i * 7919) % vocab for i in range(1, PROMPT_TOKENS + 1)]
    stamps: list[float] = []
    seq = runner.sequence(1, settings, None, SamplingParams(temperature=0, max_tokens=STEADY_STEPS + 3,
                                                            ignore_eos=True),
                          lambda e: stamps.append(time.perf_counter()) if isinstance(e, Token) else None,
                          prompt_ids=ids)
    t = time.perf_counter()
    sched.add(seq)
    while sched.busy:
        sched.step()
    runner.backend.synchronize()
    out["first token"] = stamps[0] - t
    out["first decode step"] = stamps[1] - stamps[0]
    steps = [b - a for a, b in zip(stamps[2:], stamps[3:])]
    out["steady decode step"] = sum(steps) / len(steps)
    out["first-step stall"] = max(0.0, out["first decode step"] - out["steady decode step"])
    return out


def table(runs: list[dict[str, float]], title: str) -> str:
    head = f"| stage | {' | '.join(f'run {i + 1}' for i in range(len(runs)))} |"
    lines = [title, "", head, "|" + " --- |" * (len(runs) + 1)]
    for stage in STAGES:
        cells = " | ".join(f"{r[stage] * 1000:.0f} ms" if r[stage] < 1 else f"{r[stage]:.2f} s" for r in runs)
        lines.append(f"| {stage} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str], settings: EngineSettings, runs: int, as_json: bool) -> int:
    """`runs` fresh processes (each `python -m engine bench-start ... --runs 0 --json`), or with
    runs == 0 this process's one start as JSON."""
    if runs == 0:
        result = measure(settings, log=lambda m: print(m, file=sys.stderr))
        print(json.dumps(result))
        return 0
    child = [a for a in argv if a != "--json"]
    if "--runs" in child:
        i = child.index("--runs")
        del child[i:i + 2]
    results = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-m", "engine", *child, "--runs", "0"], capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            return done.returncode
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if as_json:
        print(json.dumps(results))
    else:
        where = settings.model or "the default model"
        print(table(results, f"bench-start: {where}, backend {settings.backend}, {settings.parallel} streams of "
                             f"{settings.context} tokens"))
    return 0
