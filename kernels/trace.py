"""`bench --trace`: where a decode graph's step goes, launch by launch, on its critical path.

With tracing started before any kernel compiles, every kernel is built with -DLANECHAT_TRACE: the
first block of each launch stamps %globaltimer into one device buffer as its programmatic wait
returns, which is when the launch ahead of it has ended (common.cuh PDL_ENTRY). The stamps of each
graph replay are kept apart, so launch i's time from its own wait to launch i + 1's is its cost on
the step's critical path, the stateful kernels (the DeltaNet's conv and scan) included, which
`bench --double` cannot measure. The graph's last launch has no stamp after it.
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

import numpy as np

CAPACITY = 1 << 14  # stamps a replay may hold (a decode graph has a few hundred launches)
DEFINE = "-DLANECHAT_TRACE"


class _Trace:
    def __init__(self) -> None:
        import cupy
        self.buf = cupy.zeros(CAPACITY + 1, cupy.uint64)  # [0] the count, then the stamps
        self.capturing: list[str] | None = None
        self.pending: list = []  # modules loaded while a graph was captured: attached after it
        self.replays: dict[str, tuple[list[str], list]] = {}  # per graph: its launches, its replays' stamps


_trace: _Trace | None = None


def start() -> None:
    """Trace from now on: call before any kernel is compiled (the stamp is compiled in)."""
    global _trace
    _trace = _Trace()


def active() -> bool:
    return _trace is not None


def attach(module) -> None:
    """Point a freshly loaded module's stamp buffer at the trace's; during a capture (a kernel first
    used there, where no copy may run) once the capture ends, before any replay."""
    import cupy
    if _trace is None:
        return
    s = cupy.cuda.get_current_stream()
    if s.ptr and s.is_capturing():
        _trace.pending.append(module)
        return
    ptr = module.get_global("lc_trace")
    cupy.ndarray((1,), cupy.uint64, ptr).set(np.array([_trace.buf.data.ptr], np.uint64))


def captured(name: str, grid) -> None:
    """A launch recorded into the graph being captured (under `capture`)."""
    if _trace is not None and _trace.capturing is not None:
        _trace.capturing.append(f"{name} {tuple(grid)}")


@contextmanager
def capture() -> Iterator[list[str]]:
    """Collect the names of the launches captured inside the block, in order."""
    names: list[str] = []
    if _trace is not None:
        _trace.capturing = names
    try:
        yield names
    finally:
        if _trace is not None:
            _trace.capturing = None
            pending, _trace.pending = _trace.pending, []
            for module in pending:
                attach(module)


@contextmanager
def replay(key: str, names: list[str], stream) -> Iterator[None]:
    """Around one launch of the graph called `key` (its captured `names`): the count zeroed before it, its
    stamps copied after it, on its stream (no host wait)."""
    if _trace is None or not names:  # graphs captured before tracing started
        yield
        return
    with stream:
        _trace.buf[:1] = 0
        yield
        _trace.replays.setdefault(key, (names, []))[1].append(_trace.buf[:len(names) + 1].copy())


def report(top: int = 30) -> list[str]:
    """Per graph: its launch classes by their summed time on the critical path per step (µs)."""
    if _trace is None:
        return []
    return [line for key, (names, stamps) in sorted(_trace.replays.items())
            for line in summary(key, names, [s.get() for s in stamps], top)]


def summary(key: str, names: list[str], stamps: list[np.ndarray], top: int = 30) -> list[str]:
    """One graph's lines of `report`: stamps per replay as copied ([0] the count, then one stamp a
    launch, ns); replays missing a stamp are left out (all of them: a line saying so)."""
    good = [s[1:len(names) + 1] for s in stamps if int(s[0]) == len(names)]
    if not good:
        counts = sorted({int(s[0]) for s in stamps})
        return [f"trace: graph of {key}: no replay stamped all {len(names)} launches ({counts})"]
    dt = np.stack([np.diff(s.astype(np.int64)) for s in good]).mean(axis=0) / 1e3  # µs, launch i to i + 1
    per: dict[str, list[float]] = defaultdict(list)
    for name, d in zip(names, dt):
        per[name].append(float(d))
    span = float(np.mean([int(s[-1]) - int(s[0]) for s in good])) / 1e3
    lines = [f"trace: graph of {key}, {len(good)} replays, {len(names)} launches, first to last launch "
             f"{span:.1f} µs; by launch class, µs a step (launches x µs each):"]
    for name, ds in sorted(per.items(), key=lambda kv: -sum(kv[1]))[:top]:
        lines.append(f"  {sum(ds):8.1f}  {len(ds):4d} x {sum(ds) / len(ds):6.2f}  {name}")
    return lines
