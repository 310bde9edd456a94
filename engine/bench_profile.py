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


def profile_step(runner, sched, position: int = PROFILE_POSITION) -> list[tuple[str, tuple, float]]:
    """(kernel, grid, µs) of every launch of one decode step and its token choice, for one stream at
    `position` on a lane of its own (the K/V it reads are whatever its pages hold: the timing is the
    same). Empty on a backend without kernels."""
    b = runner.backend
    if b.name != "cupy":
        return []
    import kernels
    lane = sched.lanes.acquire()
    if lane is None or not sched.lanes.ensure(lane, position + 1):
        raise PlanError("bench --profile needs a free lane with room for its position")
    rows = Rows(np.array([17]), np.array([position]), sched.lanes.table(lane)[None], np.array([lane.index]), False)
    greedy = [SamplingParams(temperature=0)]
    graphs, b.graphs = b.graphs, False
    try:
        b.choose(b.decode_step(runner.model, rows, sched.cache), greedy, [position + 1])  # every kernel loaded
        b.synchronize()
        with kernels.timing() as timer:
            timer.backlog()
            b.choose(b.decode_step(runner.model, rows, sched.cache), greedy, [position + 1])
        return timer.rows()
    finally:
        b.graphs = graphs
        sched.cache.reset(lane.index)
        sched.lanes.release(lane)


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
