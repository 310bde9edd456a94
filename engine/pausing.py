"""Who waits and who pauses when the KV pool is short: the rules that keep every stream moving.

The scheduler applies them every step:

- A waiting stream is admitted only when its next piece fits (its first prompt chunk, or its
  snapshot's positions and the piece after them) and no active stream is itself short of pages,
  so a newcomer never takes the pages an admitted stream waits for.
- While lane 0 (the engine's own) is idle, its reserve is lent to the other lanes; when lane 0
  needs it back, the youngest borrowers pause.
- A step in which no stream could advance pauses the youngest stream (prompt readers too).

A paused stream's K/V rows and recurrent state go to host memory (`Cache.read`) and come back bit
for bit (`Cache.write`) when it is admitted again, on whichever lane is free: nothing decode wrote
is ever recomputed, so its output is what it would have been unpaused.

Why this terminates: a lone stream always fits (the pool holds at least one context, and a stream
never grows past its context), so pausing the youngest until one is left lets the oldest advance;
a stream admitted again holds the pages of its next piece, so its admission step advances it too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .kv import Lanes
    from .scheduler import Sequence


def next_end(seq: Sequence, chunk: int) -> int:
    """Positions the stream's next piece needs: the end of its next prompt chunk (chunks end at
    absolute multiples of `chunk`), or one more for a decode step. A waiting stream with a
    snapshot goes on from the snapshot's positions."""
    computed = seq.resume.cache.n if seq.lane is None and seq.resume is not None else seq.computed
    if computed < seq.target:
        return min(seq.target, (computed // chunk + 1) * chunk)
    return computed + 1


def youngest(seqs: list[Sequence]) -> Sequence:
    """The stream that arrived last: the one to pause (an older stream keeps its progress)."""
    return max(seqs, key=lambda q: q.arrival)


def short(lanes: Lanes, active: list[Sequence], chunk: int) -> bool:
    """Whether some active stream cannot place its next piece."""
    return any(not lanes.fits(q.lane, next_end(q, chunk)) for q in active)


def borrower(lanes: Lanes, active: list[Sequence], tokens: int) -> Sequence | None:
    """The stream to pause so that lane 0 gets `tokens` positions back from its lent reserve;
    None when lane 0 fits already or nobody holds what it lent."""
    own = lanes.lanes[0]
    if own.window or lanes.fits(own, tokens) or not lanes.lent():
        return None
    others = [q for q in active if q.lane is not own and q.lane.pages]
    return youngest(others) if others else None
