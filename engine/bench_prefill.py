"""The bench's prompt-side figures: MFU beside prompt tok/s, and decode while a long prompt is read.

MFU = model FLOPs per prompt token x tok/s / the device's dense GEMM rate measured in the same run
(cuBLAS fp16 8192^3 through CuPy on the GPU, the tensor cores' bf16 rate too; numpy float32 1024^3 on
the CPU). Model FLOPs per token: 2 M K for every product a row takes (experts: top-k of E), the
attention over the prompt's average length (4 heads x head_dim per key) and the DeltaNet state update
(7 FLOPs a state element: decay, two matrix-vector products, the rank-1 update); the head is left out
(a prompt chunk computes logits for its last row only).
"""
from __future__ import annotations

import statistics
import time

from .config import FULL
from .settings import SamplingParams


def product_flops(model) -> float:
    """2 M K per token for every [M, K] weight of the layers; stacked experts [E, M, K] count top-k."""
    cfg = model.cfg
    share = cfg.top_k / cfg.experts if cfg.experts else 1.0

    def walk(w) -> float:
        if isinstance(w, dict):
            return sum(walk(v) for v in w.values())
        shape = getattr(w, "shape", None)
        if shape is None or len(shape) < 2:
            return 0.0
        n = 2.0 * shape[-1] * shape[-2]
        return n * share * shape[0] if len(shape) == 3 else n
    return sum(walk(layer) for layer in model.layers)


def prompt_flops_per_token(model, n: int) -> float:
    """Model FLOPs per token of an n-token prompt (the module docstring's count)."""
    cfg = model.cfg
    full = sum(1 for t in cfg.layer_types if t == FULL)
    attention = 4.0 * full * cfg.heads * cfg.head_dim * (n + 1) / 2
    deltanet = 7.0 * len(cfg.linear_layers) * cfg.lin_v_heads * cfg.lin_k_dim * cfg.lin_v_dim
    return product_flops(model) + attention + deltanet


def gemm_rate(backend) -> tuple[float, str]:
    """(FLOP/s of a dense GEMM on this backend, what was measured): the median of 5 after 2 warm-ups."""
    if backend.name == "cupy":
        import cupy
        backend.make_current()
        n, what = 8192, "cuBLAS fp16 8192^3"
        a = cupy.random.random((n, n), dtype=cupy.float32).astype(cupy.float16)
        b = cupy.random.random((n, n), dtype=cupy.float32).astype(cupy.float16)
        times = []
        for i in range(7):
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            e0.record()
            cupy.matmul(a, b)
            e1.record()
            e1.synchronize()
            if i >= 2:
                times.append(cupy.cuda.get_elapsed_time(e0, e1) / 1e3)
        del a, b
    else:
        import numpy as np
        n, what = 1024, "numpy float32 1024^3"
        a = np.random.default_rng(0).random((n, n), dtype=np.float32)
        times = []
        for i in range(7):
            t = time.perf_counter()
            a @ a
            if i >= 2:
                times.append(time.perf_counter() - t)
    return 2.0 * n ** 3 / statistics.median(times), what


def mfu_note(model, n: int, tok_s: float, rate: float) -> str:
    return f"MFU {100 * prompt_flops_per_token(model, n) * tok_s / rate:.1f} %"


def interleave_names(S: int, n: int) -> tuple[str, str]:
    return (f"{S} streams while a {n:,}-token prompt is read", f"the {n:,}-token prompt beside {S} streams")


def interleave_cells(bench, sched, S: int, prompt: list[int], solo_tok_s: float | None, chats: list[list[dict]],
                     decode_tokens: int, log) -> list:
    """Decode tok/s of S streams alone and while `prompt` arrives and is read (from its arrival to its
    first token), and that prompt's tok/s against its solo rate: the issue's bound is at most a 30 %
    drop for the streams and at least 50 % of solo for the prompt."""
    from .bench import Cell
    runner, s = bench.runner, bench.settings
    params = SamplingParams(temperature=0, max_tokens=s.context, ignore_eos=True)
    streams = [runner.sequence(bench.next_id(), s, chats[i % len(chats)], params, lambda e: None) for i in range(S)]
    for q in streams:
        sched.add(q)

    def run_until(done) -> tuple[float, int]:
        runner.backend.synchronize()
        t, g = time.perf_counter(), sum(q.generated for q in streams)
        while sched.busy and not done():
            sched.step()
        runner.backend.synchronize()
        return time.perf_counter() - t, sum(q.generated for q in streams) - g
    run_until(lambda: min(q.generated for q in streams) >= 4)  # every stream decoding (graphs captured)
    start = min(q.generated for q in streams)
    dt, made = run_until(lambda: min(q.generated for q in streams) >= start + decode_tokens)
    alone = made / dt
    long = runner.sequence(bench.next_id(), s, None, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
                           lambda e: None, prompt)
    sched.add(long)
    dt, made = run_until(lambda: long.generated > 0)
    sched.cancel_all("bench: the cell is measured")
    names = interleave_names(S, len(prompt))
    if not long.generated:
        return [Cell(names[0], note="skipped: the long prompt did not run beside the streams"), Cell(names[1])]
    during, read = made / dt, len(prompt) / dt
    drop = f"alone {alone:,.1f} tok/s: {100 * (during / alone - 1):+.0f} % (bound -30 %)"
    share = (f"solo {solo_tok_s:,.1f} tok/s: {100 * read / solo_tok_s:.0f} % of it (bound 50 %)" if solo_tok_s
             else "no solo cell of this length")
    log(f"bench: {names[0]}: {during:.1f} tok/s, {drop}; the prompt {read:.1f} tok/s, {share}")
    return [Cell(names[0], tok_s=during, note=drop), Cell(names[1], tok_s=read, note=share)]
