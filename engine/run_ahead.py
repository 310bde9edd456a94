"""Run-ahead decode: while the same streams decode step after step, the next step is queued on the
tokens the device chose (`Backend.chosen`, `Rows.fed`) before the host reads them, so the device does
not wait for the host's work between steps (60-110 µs a step on an H100: 2-5 % of a decode step).

A stream that stops has then fed one row past its end. Its K/V there sit at a position nothing reads
before it is written again; its recurrent state must not move on. So a row fed one of the tokenizer's
end tokens (EOS, unless the stream ignores it) is voided on the device (`Rows.ends`: lane -1), and the
streams of a hybrid model with stop strings, which only the host sees, do not run ahead. A hybrid
model's queued step refreshes the state checkpoints that are due; where its launch raises, its streams'
states come back from them before their next step (`Scheduler.stale`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .scheduler import Scheduler, Sequence


@dataclass
class Ahead:
    """A decode step queued on device-chosen tokens: its streams, their tokens (`Backend.chosen`), and
    the ids of the streams whose row is void (they stopped in the step before)."""
    seqs: list
    chosen: object
    void: set[int] = field(default_factory=set)


class RunAhead:
    """The decode step a scheduler queued ahead, if any (`queued`), and the rules for queuing one."""

    def __init__(self, sched: Scheduler):
        self.s = sched
        self.queued: Ahead | None = None  # its tokens not read yet
        self.ends = tuple(sorted(sched.tok.eos_ids))  # the tokens a fed row's stream ends on (`Rows.ends`)

    def after(self, seqs: list[Sequence], chosen) -> Ahead | None:
        """A plain decode step of `seqs` chose `chosen` on the device: queue the next one now, where it
        may run ahead."""
        self.queued = self._launch(seqs, chosen)
        return self.queued

    def step(self) -> bool:
        """A scheduler step in steady decode: the step queued ahead has this step's streams, so the one
        after it is queued before its tokens are read. False (nothing done) where that does not hold."""
        a = self.queued
        if a is None or a.void or not self._may(a.seqs):
            return False
        nxt = self._launch(a.seqs, a.chosen)
        if nxt is None:
            return False
        self.queued = nxt
        self.s.apply(a.seqs, self.s.b.take(a.chosen), nxt, a.void)
        return True

    def drain(self) -> None:
        """Give the streams of the step queued ahead, if any, its tokens: before anything but steady
        decode (admission, prompt chunks, cancels) changes the streams."""
        a, self.queued = self.queued, None
        if a is not None:
            self.s.apply(a.seqs, self.s.b.take(a.chosen), None, a.void)

    def _may(self, seqs: list[Sequence]) -> bool:
        """Whether the step after the one queued for `seqs` (tokens not read) is theirs alone again:
        nothing else to admit or read, none of them at its length limit or with a state to put back,
        no stop strings for a hybrid model's state, a page for each."""
        s = self.s
        return (s.run_ahead and s.verifier is None and not s.waiting and not s._reading
                and len(seqs) == len(s.active)
                and all(q.generated + 1 < q.params.max_tokens and len(q.tokens) + 1 < s.s.context
                        and q.id not in s.stale and not (s.cache.stateful and q.params.stop) for q in seqs)
                and all(s.lanes.ensure(q.lane, q.computed + 2) for q in seqs))

    def _launch(self, seqs: list[Sequence], chosen) -> Ahead | None:
        """Queue the decode step after the one that chose `chosen` (which feeds position computed), on
        those tokens; None where it may not run ahead or its launch raised: the streams then take that
        step as usual, and a fault raises there, as theirs."""
        if not self._may(seqs):
            return None
        s = self.s
        flags = np.array([0 if q.params.ignore_eos else 1 for q in seqs])  # the rows an end token voids
        rows = s.decode_rows(seqs, flags, ahead=1)
        rows.fed, rows.ends = chosen, self.ends
        rows.choose = [q.params for q in seqs], [len(q.tokens) + 1 for q in seqs]
        try:
            if s.cache.stateful:
                s.checkpoints.keep(seqs, ahead=1)
            nxt = s.b.chosen(s.run_decode(rows), *rows.choose)
        except Exception as e:
            s.raise_if_lost(e)
            if s.cache.stateful:
                s.stale.update(q.id for q in seqs)
            return None
        if nxt is None:  # the parameters are the step before's: its rows were all the device's
            raise RuntimeError("a decode step queued ahead did not choose its tokens on the device")
        return Ahead(seqs, nxt)
