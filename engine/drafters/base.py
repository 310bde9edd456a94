"""The drafter interface: what a verify window asks of a drafter."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..scheduler import Scheduler, Sequence


class Drafter:
    """Proposes tokens to follow a stream's tokens. A drafter keeps what it needs per stream in
    `seq.draft` (it owns that field) and never changes anything else of the stream.

    `wants_hidden`: the target's final-normed hidden state of every row it computes for the stream
    reaches `observe` (prompt chunks and the accepted rows of decode steps), in position order;
    with `taps`, the outputs of those target layers instead, concatenated.
    """
    name = "none"
    wants_hidden = False
    taps: tuple[int, ...] = ()

    def bind(self, sched: Scheduler) -> None:
        """The scheduler it drafts for (a drafter with K/V of its own reads its cache and lanes)."""

    def propose(self, seq: Sequence, k: int) -> list[int]:
        """Up to k tokens that may follow seq.tokens (fewer or none: the window pads)."""
        raise NotImplementedError

    def observe(self, seq: Sequence, first: int, hidden: Any) -> None:
        """Hidden states (backend array [n, hidden]) of positions first..first+n-1 of the stream,
        before their tokens are appended (rows past its end where the stream ends inside a window)."""
