"""Recurrent-state checkpoints of a hybrid model's lanes, for a batched decode step that raises.

Copying every row's DeltaNet state aside before each batched step cost more than the step's host work
(8 lanes of the 27B's shape: 1.2 GB a step). Instead a lane's saved slot is refreshed only when it is
`REPLAY_STEPS` or more decode steps behind its stream (or holds another stream's state). To put a
row back at position n after a failed step, its saved slot comes back and the decode steps from there
to n run again one row at a time: a row's bits are the same alone as in any batch (and a verify
window's accepted rows are a plain step's), so the state is the one the failed step started from.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .kv import Lanes
from .kv.cache import Cache
from .rows import Rows

REPLAY_STEPS = 64  # decode steps a failed batch replays at most for one stream


class StateCheckpoints:
    def __init__(self, cache: Cache, lanes: Lanes, replay_steps: int = REPLAY_STEPS):
        self.cache, self.lanes, self.replay_steps = cache, lanes, replay_steps
        self._at: dict[int, tuple[object, int]] = {}  # lane index -> (stream, computed) its saved slot holds
        self.copies = 0  # lanes copied aside so far (tests and benches read these two)
        self.replayed = 0  # decode rows run again to put states back

    def keep(self, seqs: list, ahead: int = 0) -> None:
        """Before a batched step: refresh the saved slots of the streams that are due, in one copy.
        `ahead`: steps queued before it whose tokens are not applied yet (their states are the ones saved)."""
        if not self.cache.stateful:
            return
        due = [q for q in seqs if self._replay_from(q, q.computed + ahead) is None]
        if due:
            self.cache.checkpoint([q.lane.index for q in due])
            self.copies += len(due)
            for q in due:
                self._at[q.lane.index] = (q, q.computed + ahead)

    def restore(self, seq, end: int, run: Callable[[Rows], object]) -> None:
        """Bring `seq`'s lane state back to position `end`: its saved slot, then `run` (a decode
        forward) over its tokens from there to `end`, one row a step."""
        if not self.cache.stateful:
            return
        start = self._replay_from(seq, end)
        if start is None:
            raise RuntimeError(f"stream {seq.id}: no state checkpoint to go back to")
        lane = seq.lane.index
        self.cache.rollback([lane])
        table = self.lanes.table(seq.lane)[None]
        self.replayed += end - start
        for p in range(start, end):
            run(Rows(np.array([seq.tokens[p]]), np.array([p]), table, np.array([lane]), False))

    def _replay_from(self, seq, at: int | None = None) -> int | None:
        """Where `seq`'s saved slot stands if it can be replayed from there to `at` (default: its
        computed positions), else None."""
        at = seq.computed if at is None else at
        kept = self._at.get(seq.lane.index)
        if kept is None or kept[0] is not seq or not 0 <= at - kept[1] < self.replay_steps:
            return None
        return kept[1]
