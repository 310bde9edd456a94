"""`python -m engine bench`: prompt and decode throughput, and the memory roofline (DESIGN §9).

Cells, as in the seed's table: prompt tok/s at 2,048 / 9,216 / 15,000 tokens (one prompt each, after a
warm-up), and aggregate decode tok/s of 1, 4 and 8 streams x 256 tokens (fixed chat prompts,
ignore_eos: the tokens after the first over the time since the first, as llama.cpp counts its decode;
the note gives the rate with the prompt counted in), greedy and at temperature 1.0 (top_k 40, top_p
0.95: the app's defaults). For every decode cell, the fraction of the memory roofline: the bytes a decode step must
read (every weight it touches, the embedding rows it gathers, each stream's K/V so far, and the DeltaNet
state each stream reads and writes back) over the
step time, over the device-to-device copy bandwidth measured in the same run (bytes read + written).

`--interleave S` (default 4) adds "decode while a long prompt is read": S streams decoding alone, then
while the longest prompt length arrives and is read, and that prompt's rate against its solo cell.
Prompt cells carry MFU (engine/bench_prefill.py).

`--drafter NAME --draft-tokens K` adds, after each decode cell, the same cell decoded in verify
windows (`--drafter oracle` proposes the plain cell's own tokens: every draft accepted, the ceiling
any drafter can reach): tok/s, the mean accepted length, and the verify window's cost, the median
step time of a window of K + 1 rows per stream over that of one row per stream.

`--synthetic NAME` builds random weights of a real model's shapes in the real affine 4-bit format
(engine/synthetic.py shapes); on the GPU they are generated in device memory, no files and no host
round trip.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from .bench_prefill import gemm_rate, interleave_cells, interleave_names, mfu_note
from .bench_profile import PROFILE_POSITION, format_profile, profile_chunk, profile_step
from .errors import PlanError, RequestError
from .settings import EngineSettings, SamplingParams

if TYPE_CHECKING:
    from .engine import Runner
    from .scheduler import Scheduler

CHATS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash map works, with an example in Python.",
    "What are the main causes of the French Revolution?",
    "Give me a weekly meal plan for a vegetarian athlete.",
    "def quicksort(xs):\n    # finish this function and explain its complexity",
    "Describe the water cycle to a ten-year-old.",
    "Compare TCP and UDP in a table.",
    "Draft a polite email asking to move a meeting to Thursday.",
]
GB = 1e9
GIB = 1 << 30


# --- bytes a decode step reads -------------------------------------------------------------------
def _nbytes(w) -> int:
    if isinstance(w, dict):
        return sum(_nbytes(v) for v in w.values())
    if isinstance(w, (list, tuple)):
        return sum(_nbytes(v) for v in w)
    return int(getattr(w, "nbytes", 0) or 0)


def _rows_of(w) -> int:
    shape = getattr(w, "shape", None)
    return int(shape[0]) if shape else 1


def step_weight_bytes(model, rows: int) -> int:
    """Every layer's weights, the final norm and the head, read once per step whatever the row
    count, plus the embedding rows the step gathers. MoE experts count only as many as the rows
    can route to (rows × top-k at most): the rest are never read."""
    cfg = model.cfg
    touched = min(cfg.experts, max(rows, 1) * cfg.top_k) / cfg.experts if cfg.experts else 1.0
    total = sum(_nbytes(v) * (touched if k.startswith("experts") else 1)
                for layer in model.layers for k, v in layer.items())
    total = int(total) + _nbytes(model.norm) + _nbytes(model.lm_head)
    emb = model.embed
    return total + rows * _nbytes(emb) // max(1, _rows_of(emb))


def step_kv_bytes(cfg, kv_dtype: str, positions: list[int]) -> int:
    """K/V the attention of one step reads: keys 0..position of every row."""
    return sum(p + 1 for p in positions) * cfg.kv_bytes_per_token(kv_dtype)


def step_state_bytes(cfg, rows: int) -> int:
    """The DeltaNet conv rows and fp32 state each row's stream reads and writes back in one step."""
    return 2 * rows * cfg.state_bytes_per_stream()


# --- the table -------------------------------------------------------------------------------------
@dataclass
class Cell:
    name: str
    tok_s: float | None = None
    step_ms: float | None = None
    bytes_per_step: float | None = None
    roofline: float | None = None
    note: str = ""


def fmt_num(x: float | None, digits: int = 1) -> str:
    return "" if x is None else f"{x:,.{digits}f}"


def format_table(cells: list[Cell]) -> str:
    lines = ["cell\ttok/s\tstep ms\tGB read/step\troofline"]
    for c in cells:
        row = [c.name, fmt_num(c.tok_s), fmt_num(c.step_ms, 2),
               "" if c.bytes_per_step is None else f"{c.bytes_per_step / GB:.3f}",
               "" if c.roofline is None else f"{100 * c.roofline:.1f} %"]
        if c.note:
            row.append(c.note)
        lines.append("\t".join(row))
    return "\n".join(lines)


def prompt_cell_name(n: int) -> str:
    return f"prefill {n:,} (tok/s)"


def decode_cell_name(streams: int, greedy: bool) -> str:
    return f"{streams} stream{'s' if streams > 1 else ''}, {'greedy' if greedy else 'T 1.0'}"


def history_cell_name(n: int) -> str:
    return f"1 stream after {n:,}, greedy"


# --- measuring --------------------------------------------------------------------------------------
def copy_bandwidth(backend) -> float:
    """Bytes read + written per second by a large device-to-device copy (median of 10)."""
    if backend.name == "cupy":
        import cupy
        n = int(min(2 * GIB, backend.free_memory() // 8)) // 16 * 16
        src = cupy.random.random(n // 4, dtype=cupy.float32)  # random data: never time zeros
        dst = cupy.empty_like(src)
        s = backend.stream
        times = []
        for i in range(12):
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            a.record(s)
            dst.data.copy_from_device_async(src.data, n, s)
            b.record(s)
            b.synchronize()
            if i >= 2:
                times.append(cupy.cuda.get_elapsed_time(a, b) / 1e3)
        del src, dst
        return 2 * n / statistics.median(times)
    src = np.random.default_rng(0).random((64 << 20) // 8)
    dst = np.empty_like(src)
    times = []
    for i in range(7):
        t = time.perf_counter()
        np.copyto(dst, src)
        if i >= 2:
            times.append(time.perf_counter() - t)
    return 2 * src.nbytes / statistics.median(times)


def synthetic_on_device(name: str, backend, seed: int = 0, bits: int = 4):
    """A random model of `name`'s shapes with its affine weights generated in GPU memory."""
    import cupy

    from kernels.launch import fill_random_u32

    from .synthetic import synthetic
    from .weights import Affine

    need = synthetic_bytes(name, bits)
    free = backend.free_memory()
    if need > free * 0.9:
        raise PlanError(f"synthetic {name} needs {need / GIB:.2f} GiB of weights but the GPU has {free / GIB:.2f} GiB "
                        "free; pick a smaller model")
    crng = cupy.random.RandomState(seed)
    backend.make_current()

    def make_affine(i: int, shape: tuple, b: int, g: int, std: float) -> Affine:
        *lead, out, n = shape
        packed = cupy.empty((*lead, out, n * b // 32), cupy.uint32)
        fill_random_u32(packed, seed * 1_000_003 + i)
        levels = (1 << b) - 1
        scales = (crng.uniform(0.5, 1.5, (*lead, out, n // g)) * (2 * std * 1.7 / levels)).astype(cupy.float16)
        biases = (-scales.astype(cupy.float32) * levels / 2).astype(cupy.float16)
        return Affine(packed, scales, biases, b, g)

    return synthetic(name, seed, bits, make_affine)


def synthetic_bytes(name: str, bits: int = 4) -> int:
    """Bytes of a synthetic model's weights in its quantized format (fp16 scales and biases)."""
    from .synthetic import config_for, weight_shapes
    cfg, group = config_for(name)
    total = 0
    for shape, kind in weight_shapes(cfg).values():
        n = int(np.prod(shape))
        if kind in ("linear", "router"):
            b = 8 if kind == "router" else bits
            g = group if shape[-1] % group == 0 else 32
            total += n * b // 8 + 2 * 2 * (n // g)
        else:
            total += 4 * n
    return total


@dataclass
class Bench:
    runner: object
    settings: EngineSettings
    observed: list = field(default_factory=list)  # (rows, StepStats) of every decode step
    rid: int = 0
    t_end: float = 0.0  # perf_counter when the last run ended

    def next_id(self) -> int:
        self.rid += 1
        return self.rid

    def run(self, sched, prompts, params: SamplingParams, messages: bool = False) -> tuple[float, list]:
        from .engine import run_to_end
        seqs = []
        for p in prompts:
            if messages:
                seqs.append(self.runner.sequence(self.next_id(), self.settings, p, params, lambda e: None))
            else:
                seqs.append(self.runner.sequence(self.next_id(), self.settings, None, params, lambda e: None, p))
        b = self.runner.backend
        b.synchronize()
        t = time.perf_counter()
        run_to_end(sched, seqs)
        b.synchronize()
        self.t_end = time.perf_counter()
        return self.t_end - t, seqs

    def timed_decode(self, sched) -> None:
        """Observe the scheduler's decode steps. The observer only keeps each step's stats: its time
        and bytes are worked out once the run is over, so the host's work a step is the engine's own."""
        sched.step_observer = lambda step: self.observed.append((len(step.positions), step))

    @property
    def steps(self) -> list[tuple[int, float, int]]:
        """(rows, seconds, bytes to read) of the observed steps, read once the run is over."""
        model, cfg, dtype = self.runner.model, self.runner.loaded.config, self.settings.kv_dtype
        weights: dict[int, int] = {}  # by row count: the same weights every step
        out = []
        for rows, step in self.observed:
            if rows not in weights:
                weights[rows] = step_weight_bytes(model, rows) + step_state_bytes(cfg, rows)
            out.append((rows, step.seconds, weights[rows] + step_kv_bytes(cfg, dtype, step.positions)))
        return out


def decode_seconds(seqs: list, t_end: float) -> float:
    """Decode time of streams started together: from the last first token to the end (as llama.cpp's
    tg and batched-bench S_TG count: no prompt)."""
    return t_end - max(q.t_first for q in seqs)


def decode_rate(seqs: list, t_end: float) -> float:
    """Decode tok/s: the tokens after each stream's first over `decode_seconds`."""
    return sum(q.generated - 1 for q in seqs) / decode_seconds(seqs, t_end)


def decode_cell(bench: Bench, seqs: list, wall: float, name: str, rows: int, bw: float) -> Cell:
    """A decode cell from its finished streams: decode tok/s, the step statistics, and in the note the
    rate with the prompt's time counted in and the wall time of a step with the host's work."""
    cell = step_stats(Cell(name, tok_s=decode_rate(seqs, bench.t_end)), bench, rows, bw)
    steps = sum(1 for r, _ in bench.observed if r == rows)  # a count: no device times read again
    per_step = decode_seconds(seqs, bench.t_end) / steps if steps else None
    cell.note = (f"with the prompt {sum(q.generated for q in seqs) / wall:,.1f} tok/s"
                 + (f"; {1e3 * per_step:.2f} ms a step with the host's work" if per_step else ""))
    return cell


def history_cell(bench: Bench, sched, prompt: list[int], tokens: int, name: str, bw: float) -> Cell:
    """Decode of one stream after a long prompt: tokens after the first over the time since it."""
    bench.observed.clear()
    greedy = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    wall, seqs = bench.run(sched, [prompt], greedy)
    return decode_cell(bench, seqs, wall, name, 1, bw)


def step_stats(cell: Cell, bench: Bench, rows: int, bw: float) -> Cell:
    """The cell's median step time, bytes per step and roofline, from its decode steps of `rows` rows."""
    full = [(t, by) for r, t, by in bench.steps if r == rows]
    if full:
        cell.step_ms = 1e3 * statistics.median(t for t, _ in full)
        cell.bytes_per_step = sum(by for _, by in full) / len(full)
        cell.roofline = sum(by for _, by in full) / sum(t for t, _ in full) / bw
    return cell


def ready_scheduler(runner: Runner, s: EngineSettings, run_ahead: bool = True) -> Scheduler:
    """A scheduler with every decode graph captured, as the engine starts one: no cell times a capture.
    run_ahead False: each step's tokens read before the next is queued (--no-run-ahead)."""
    sched = runner.scheduler(s)
    sched.run_ahead = sched.run_ahead and run_ahead
    sched.warm_decode()
    return sched


def drafted_cell(bench: Bench, s: EngineSettings, msgs: list, params: SamplingParams, plain: list, cell: Cell,
                 log, profiles: list[str] | None = None) -> Cell:
    """The decode cell again with the settings' drafter (the oracle learns the plain cell's tokens);
    with `profiles`, the first such cell adds the per-kernel breakdown of one verify window to it."""
    sched = ready_scheduler(bench.runner, s)
    if sched.verifier is None:
        return Cell(cell.name + f", {s.drafter}", note=f"skipped: {sched.plan.drafter_note}")
    if s.drafter == "oracle":
        for q in plain:
            sched.verifier.drafter.learn(q.tokens)
    bench.timed_decode(sched)
    bench.run(sched, msgs, replace(params, max_tokens=s.draft_tokens + 3), messages=True)  # capture the graphs
    bench.observed.clear()
    dt, seqs = bench.run(sched, msgs, params, messages=True)
    k, S = sched.plan.draft_tokens, len(msgs)  # a DFlash2 block may cap the settings' k
    windows = [t for r, t, _ in bench.steps if r == S * (k + 1)]
    mean = statistics.mean(q.stats.mean_length for q in seqs)
    out = Cell(f"{cell.name}, {s.drafter} k={k}", tok_s=decode_rate(seqs, bench.t_end),
               step_ms=1e3 * statistics.median(windows) if windows else None)
    cost = f", window {out.step_ms / cell.step_ms:.2f}x one row's step" if windows and cell.step_ms else ""
    out.note = f"mean accepted length {mean:.2f}{cost}"
    log(f"bench: {out.name}: {out.note}")
    if profiles is not None and not profiles:
        profiles.append(format_profile(profile_step(bench.runner, sched, window=k + 1), bench.runner.backend.name,
                                       f"one verify window of {k + 1} rows, 1 stream at position {PROFILE_POSITION}"))
    return out


def build_runner(a, s: EngineSettings, log):
    """A Runner for --model/--synthetic; synthetic weights on the GPU."""
    from .engine import Runner
    from .ops import get_backend
    if a.synthetic:
        backend = get_backend(s.backend, log=log)
        if backend.name == "cupy":
            t = time.perf_counter()
            loaded = synthetic_on_device(a.synthetic, backend)
            runner = Runner.from_model(loaded, backend)
            loaded.weights.clear()  # the canonical copies; the model keeps its own
            log(f"bench: synthetic {a.synthetic} built on the GPU in {time.perf_counter() - t:.1f} s")
            return runner
        s = replace(s, model=f"synthetic:{a.synthetic}")
    return Runner(s, log=log)


def main(a) -> int:
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    paging = "all" if a.kv_pages_all else ("pages" if a.kv_pages else "off")
    s = EngineSettings(model=a.model, backend=a.backend, parallel=a.parallel, context=a.context,
                       kv_dtype=a.kv_dtype, paging=paging, page_tokens=a.kv_pages or 256, memory_gib=a.memory_gib,
                       prefill_chunk=getattr(a, "prefill_chunk", 0),
                       prefill_precision=getattr(a, "prefill_precision", "fp16")).validate()
    drafter = getattr(a, "drafter", "none")
    drafted = replace(s, drafter=drafter, drafter_model=getattr(a, "drafter_model", None),
                      draft_tokens=a.draft_tokens).validate() if drafter != "none" else None
    lengths, streams = list(a.prompt_lengths), list(a.streams)
    if getattr(a, "no_pdl", False):
        from kernels.pdl import use_pdl
        use_pdl(False)
    doubled, traced = getattr(a, "double", None), getattr(a, "trace", False)
    if doubled or traced:  # refused before the model is built
        from .ops import cuda_available
        if a.backend == "numpy" or a.backend == "auto" and not cuda_available()[0]:
            what = "--double doubles" if doubled else "--trace stamps"
            raise RequestError(f"{what} launches in decode graphs: it needs the GPU backend")
        from kernels import double_launches, trace
        double_launches(doubled)
        if traced:
            trace.start()  # before any kernel compiles: the stamps are compiled in
    runner = build_runner(a, s, log)
    b, cfg = runner.backend, runner.loaded.config
    if getattr(a, "prompt_gemm", "auto") != "auto" and b.name == "cupy":
        b.prompt_gemm = a.prompt_gemm
    run_ahead = not getattr(a, "no_run_ahead", False)
    sched = ready_scheduler(runner, s, run_ahead)
    s = sched.s  # the backend's prefill chunk filled in
    bw = copy_bandwidth(b)
    wbytes = step_weight_bytes(runner.model, 0)
    gemm = f", {b.prompt_gemm}" if s.prefill_precision == "fp16" and hasattr(b, "prompt_gemm") else ""
    print(f"bench: {runner.loaded.name} on {b.name} ({b.device}), {s.kv_dtype} KV, parallel {s.parallel}, "
          f"context {s.context}, prefill chunk {s.prefill_chunk} ({s.prefill_precision}{gemm})")
    print(sched.plan.line)
    if doubled:
        print(f"bench: the decode graphs launch every kernel matching {doubled!r} twice")
    rate, rate_what = gemm_rate(b)
    if cfg.state_bytes_per_stream():
        print(f"DeltaNet state read + written per stream and step: {step_state_bytes(cfg, 1) / GB:.3f} GB")
    print(f"weights read per decode step: {wbytes / GB:.3f} GB; copy bandwidth {bw / 1e12:.3f} TB/s "
          f"(device-to-device, read + write); dense GEMM {rate / 1e12:.1f} TFLOP/s ({rate_what}, for MFU)")
    sys.stdout.flush()

    bench = Bench(runner, s)
    rng = np.random.default_rng(0)
    hi = min(cfg.vocab, 272) if runner.loaded.format == "synthetic" else cfg.vocab
    greedy = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    cells: list[Cell] = []
    window_profiles: list[str] = []  # bench --profile with a drafter: one verify window's kernels

    # warm-up: kernels compile and the prompt path runs once
    warm = min(300, s.context - 8)
    bench.run(sched, [rng.integers(16, hi, warm).tolist()], greedy)
    for n in lengths:
        if n + 2 > s.context:
            cells.append(Cell(prompt_cell_name(n), note=f"skipped: beyond --context {s.context}"))
            continue
        ids = rng.integers(16, hi, n).tolist()
        dt, _ = bench.run(sched, [ids], greedy)
        cells.append(Cell(prompt_cell_name(n), tok_s=n / dt, note=mfu_note(runner.model, n, n / dt, rate)))
        log(f"bench: prefill {n} in {dt:.2f} s")

    bench.timed_decode(sched)
    for S in streams:
        for is_greedy in (True, False):
            name = decode_cell_name(S, is_greedy)
            if S > s.parallel:
                cells.append(Cell(name, note=f"skipped: more than --parallel {s.parallel}"))
                continue
            params = SamplingParams(temperature=0.0 if is_greedy else 1.0, top_k=40, top_p=0.95,
                                    max_tokens=a.decode_tokens, ignore_eos=True, seed=7)
            msgs = [[{"role": "user", "content": CHATS[i % len(CHATS)]}] for i in range(S)]
            bench.run(sched, msgs, replace(params, max_tokens=3), messages=True)  # capture this batch's graph
            bench.observed.clear()
            dt, seqs = bench.run(sched, msgs, params, messages=True)
            cells.append(decode_cell(bench, seqs, dt, name, S, bw))
            log(f"bench: {name}: {sum(q.generated for q in seqs)} tokens in {dt:.2f} s")
            if drafted is not None:
                sched = None  # its cache's memory goes to the drafted run's, then back
                cells.append(drafted_cell(bench, drafted, msgs, params, seqs, cells[-1], log,
                                          window_profiles if getattr(a, "profile", False) else None))
                sched = ready_scheduler(runner, s, run_ahead)
                bench.timed_decode(sched)
    S = getattr(a, "interleave", 0)
    if S and lengths:
        n = max(lengths)
        names = interleave_names(S, n)
        solo = next((c.tok_s for c in cells if c.name == prompt_cell_name(n)), None)
        if S + 1 > s.parallel or n + a.decode_tokens + 2 > s.context:
            why = (f"more than --parallel {s.parallel} - 1 streams" if S + 1 > s.parallel
                   else f"beyond --context {s.context}")
            cells += [Cell(names[0], note=f"skipped: {why}"), Cell(names[1])]
        else:
            msgs = [[{"role": "user", "content": c}] for c in CHATS]
            cells += interleave_cells(bench, sched, S, rng.integers(16, hi, n).tolist(), solo, msgs, a.decode_tokens,
                                      log)
    for n in getattr(a, "history", []):
        name = history_cell_name(n)
        if n + a.decode_tokens + 2 > s.context:
            cells.append(Cell(name, note=f"skipped: beyond --context {s.context}"))
            continue
        cells.append(history_cell(bench, sched, rng.integers(16, hi, n).tolist(), a.decode_tokens, name, bw))
        steps = [t for r, t, _ in bench.steps if r == 1]
        log(f"bench: {name}: {cells[-1].tok_s:.1f} tok/s; {len(steps)} decode steps took {sum(steps):.3f} s "
            f"(longest {1e3 * max(steps, default=0):.1f} ms)")
    print(format_table(cells))
    if getattr(a, "profile", False):
        print(format_profile(profile_step(runner, sched), b.name))
        most = max((S for S in streams if S + 1 <= s.parallel), default=1)
        if most > 1:
            print(format_profile(profile_step(runner, sched, streams=most), b.name,
                                 f"one decode step, {most} streams at position {PROFILE_POSITION}"))
        for text in window_profiles:
            print(text)
        for n in getattr(a, "history", []):  # the same step where the attention reads a long history
            if n + 1 < s.context:
                print(format_profile(profile_step(runner, sched, n), b.name,
                                     f"one decode step, 1 stream at position {n}"))
        start = max(0, (max(a.prompt_lengths) - s.prefill_chunk) // s.prefill_chunk * s.prefill_chunk)
        print(format_profile(profile_chunk(runner, sched, start), b.name,
                             f"one prompt chunk of {s.prefill_chunk} rows at positions {start}.."))
    if traced:
        from kernels import trace
        print("\n".join(trace.report()))
    if b.name == "cupy":
        from kernels.pdl import enabled as pdl_enabled
        g = b.graph_stats()
        print(f"decode graphs replayed: {g.captured} batch sizes captured, {len(g.failed)} failed, "
              f"pool {g.pool_bytes / GIB:.2f} GiB, programmatic launches {'on' if pdl_enabled() else 'off'}")
    return 0
