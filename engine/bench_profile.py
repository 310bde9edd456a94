"""`bench --profile`: the kernels of one decode step and of one prompt chunk, each timed by CUDA events
(graphs off, so every kernel launches on its own, queued behind a wait so that no event pair counts
launch time), grouped by kernel and grid, largest first."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .errors import PlanError
from .rows import Rows
from .settings import SamplingParams

PROFILE_POSITION = 300  # the stream's position in the profiled step


def profile_step(runner, sched, position: int = PROFILE_POSITION, streams: int = 1,
                 window: int = 1) -> list[tuple[str, tuple, float]]:
    """(kernel, grid, µs) of every launch of one decode step and its token choices: `streams` streams
    at `position`, each on a lane of its own, each a verify window of `window` rows (positions
    position..position + window - 1; the K/V they read are whatever the pages hold: the timing is
    the same). Empty on a backend without kernels."""
    b = runner.backend
    if b.name != "cupy":
        return []
    import kernels
    lanes, graphs = [], b.graphs
    try:
        for _ in range(streams):
            lane = sched.lanes.acquire()
            if lane is None:
                raise PlanError(f"bench --profile needs {streams} free lanes")
            lanes.append(lane)
            if not sched.lanes.ensure(lane, position + window):
                raise PlanError("bench --profile needs lanes with room for its positions")
        rows = profile_rows(sched, lanes, position, window)
        greedy, keys = [SamplingParams(temperature=0)] * len(rows), (rows.positions + 1).tolist()

        def step() -> None:
            out = b.decode_step(runner.model, rows, sched.cache)
            b.choose(out[0] if rows.hidden else out, greedy, keys)

        b.graphs = False
        step()  # every kernel loaded
        b.synchronize()
        with kernels.timing() as timer:
            timer.backlog()
            step()
        return timer.rows()
    finally:
        b.graphs = graphs
        for lane in lanes:
            sched.cache.reset(lane.index)
            sched.lanes.release(lane)


def profile_rows(sched, lanes: list, position: int, window: int = 1) -> Rows:
    """Decode rows of these lanes at `position`, each a window of `window` rows (positions position..
    position + window - 1) as the drafter's verifier runs them (its hidden states and taps)."""
    v = sched.verifier if window > 1 else None
    hidden = v is not None and v.wants_hidden
    n = len(lanes) * window
    return Rows(np.full(n, 17), np.tile(position + np.arange(window), len(lanes)),
                np.repeat(np.stack([sched.lanes.table(x) for x in lanes]), window, 0),
                np.repeat([x.index for x in lanes], window), False, window=window, hidden=hidden,
                taps=v.taps if hidden else ())


def profile_chunk(runner, sched, start: int) -> list[tuple[str, tuple, float]]:
    """(kernel, grid, µs) of every launch of one prompt chunk (the scheduler's chunk size) of one
    stream whose positions start at `start`, a multiple of the chunk: its attention reads `start`
    earlier positions. Empty on a backend without kernels."""
    b = runner.backend
    if b.name != "cupy":
        return []
    import kernels
    C = sched.s.prefill_chunk
    lane = sched.lanes.acquire()
    if lane is None or not sched.lanes.ensure(lane, start + C):
        raise PlanError("bench --profile needs a free lane with room for its prompt chunk")
    pos = np.arange(start, start + C)
    rows = Rows(np.full(C, 17), pos, np.tile(sched.lanes.table(lane), (C, 1)), np.full(C, lane.index), True, C,
                np.array([C - 1]), fp16=sched.s.prefill_precision == "fp16")
    try:
        runner.model.forward(rows, sched.cache)  # every kernel loaded
        b.synchronize()
        with kernels.timing() as timer:
            timer.backlog(1000.0)
            runner.model.forward(rows, sched.cache)
            b.synchronize()
        return timer.rows()
    finally:
        sched.cache.reset(lane.index)
        sched.lanes.release(lane)


def format_profile(launches: list[tuple[str, tuple, float]], backend: str,
                   what: str = f"one decode step, 1 stream at position {PROFILE_POSITION}") -> str:
    if not launches:
        return f"profile: the {backend} backend launches no kernels; nothing to break down"
    groups: OrderedDict[tuple[str, tuple], list[float]] = OrderedDict()
    for name, grid, us in launches:
        groups.setdefault((name, grid), []).append(us)
    total = sum(us for _, _, us in launches)
    lines = [f"profile: {what}, graphs off: "
             f"{len(launches)} launches, {total:,.1f} µs of kernels",
             "kernel\tgrid\tlaunches\tµs each\tµs\tshare"]
    for (name, grid), times in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        t = sum(times)
        lines.append(f"{name}\t{'x'.join(map(str, grid))}\t{len(times)}\t{t / len(times):,.1f}\t{t:,.1f}\t"
                     f"{100 * t / total:.1f} %")
    return "\n".join(lines)
