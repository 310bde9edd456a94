"""Verify windows: the target checks a stream's drafts in one decode forward of k + 1 rows.

Row 0 of a stream's window feeds its last committed token at position p, row j its draft j at
p + j; every row is an ordinary decode row (each computed as a one-row decode step would compute
it), reading the rows before it in its window. The target's token after row j is chosen as plain
decoding chooses it (argmax, or sampled with the key (seed, p + j + 1)); draft j is accepted
exactly when it equals the token chosen after row j - 1, so the stream gets the longest accepted
prefix plus the target's own next token (the bonus), which is what plain decoding would produce,
token for token, at every temperature.

Every stream of a step gets the same window (k + 1 rows; 1 when no stream has a draft, which is
plain decoding): a stream with fewer drafts pads with rows on the scratch page, so the GPU's decode
graphs see only two shapes per batch size. The recurrent state after every row is kept (the cache's
window slots) and the accepted row's becomes the lane's; rejected rows' K/V are simply written over
later.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..rows import Rows
from .base import Drafter

if TYPE_CHECKING:
    from ..scheduler import Scheduler, Sequence

OFF = "off"  # seq.draft after a drafter failed on it: plain decoding for the rest of the stream


def accepted(drafts: list[int], chosen: list[int]) -> int:
    """How many drafts the target accepts: the longest prefix with drafts[i] == chosen[i], where
    chosen[i] is the target's token after window row i (so chosen has one more entry)."""
    a = 0
    while a < len(drafts) and drafts[a] == chosen[a]:
        a += 1
    return a


@dataclass
class DraftStats:
    """Per stream: verify windows run and drafts accepted (mean accepted length = 1 + accepted / windows)."""
    windows: int = 0
    accepted: int = 0

    @property
    def mean_length(self) -> float:
        return 1.0 + self.accepted / self.windows if self.windows else 0.0


class Verifier:
    """A scheduler's decode step with a drafter: propose, verify in one forward, accept."""

    def __init__(self, sched: Scheduler, drafter: Drafter, k: int):
        self.sched, self.drafter, self.k = sched, drafter, k
        drafter.bind(sched)

    @property
    def wants_hidden(self) -> bool:
        return self.drafter.wants_hidden

    @property
    def taps(self) -> tuple[int, ...]:
        return self.drafter.taps

    # --- drafts ------------------------------------------------------------------------------
    def room(self, seq: Sequence) -> int:
        """Drafts this stream may verify now: k, fewer near its context or token limit, or as many
        as the pool has pages for."""
        sched, p = self.sched, seq.computed
        room = min(self.k, sched.s.context - 2 - p, seq.params.max_tokens - seq.generated - 1)
        while room > 0 and not sched.lanes.ensure(seq.lane, p + room + 1):
            room -= 1
        return max(room, 0)

    def drafts(self, seq: Sequence) -> list[int]:
        room = 0 if seq.draft == OFF else self.room(seq)
        if room == 0:
            return []
        try:
            out = [int(t) for t in self.drafter.propose(seq, room)][:room]
        except Exception as e:
            self.fail(seq, e)
            return []
        vocab = self.sched.model.cfg.vocab
        if any(not 0 <= t < vocab for t in out):
            self.fail(seq, ValueError(f"a draft token outside the vocabulary (0..{vocab - 1})"))
            return []
        return out

    def fail(self, seq: Sequence, e: Exception) -> None:
        seq.draft = OFF
        print(f"drafter {self.drafter.name} failed on request {seq.id} ({type(e).__name__}: {e}); "
              "that stream continues without drafts", file=sys.stderr)

    def observe(self, seq: Sequence, first: int, hidden) -> None:
        if seq.draft == OFF:
            return
        try:
            self.drafter.observe(seq, first, hidden)
        except Exception as e:
            self.fail(seq, e)

    # --- one step ------------------------------------------------------------------------------
    def rows(self, seqs: list[Sequence], drafts: list[list[int]], W: int) -> Rows:
        """Stream by stream, W rows each: the last committed token, the drafts, then scratch padding."""
        sched = self.sched
        n = len(seqs) * W
        tokens, positions = np.zeros(n, np.int32), np.zeros(n, np.int32)
        lanes = np.full(n, -1, np.int32)
        tables = np.full((n, sched.lanes.window_pages), sched.cache.scratch_page, np.int32)
        for s, (seq, d) in enumerate(zip(seqs, drafts)):
            r = slice(s * W, s * W + 1 + len(d))
            tokens[r] = [seq.tokens[seq.computed]] + d
            positions[r] = np.arange(seq.computed, seq.computed + 1 + len(d))
            lanes[r] = seq.lane.index
            tables[r] = sched.lanes.table(seq.lane)
        return Rows(tokens, positions, tables, lanes, False, window=W, hidden=self.wants_hidden, taps=self.taps)

    def decode_shapes(self) -> list[tuple[int, bool, tuple]]:
        """(window, hidden, taps) of the decode rows `step` runs: plain rows, or windows of k + 1."""
        return [(w, self.wants_hidden, self.taps) for w in (1, self.k + 1)]

    def step(self, seqs: list[Sequence]) -> None:
        sched, b = self.sched, self.sched.b
        drafts = [self.drafts(seq) for seq in seqs]
        W = self.k + 1 if any(drafts) else 1
        rows = self.rows(seqs, drafts, W)
        out = sched.run_decode(rows)
        logits, hidden = out if rows.hidden else (out, None)
        real = [s * W + j for s, d in enumerate(drafts) for j in range(len(d) + 1)]
        if len(real) != len(rows):
            logits = logits[b.asarray(np.asarray(real, np.int64))]
        params = [seq.params for seq, d in zip(seqs, drafts) for _ in range(len(d) + 1)]
        keys = [len(seq.tokens) + j for seq, d in zip(seqs, drafts) for j in range(len(d) + 1)]
        chosen = b.choose(logits, params, keys)
        at = 0
        for s, (seq, d) in enumerate(zip(seqs, drafts)):
            mine = chosen[at:at + len(d) + 1]
            at += len(d) + 1
            a = accepted(d, mine)
            kept = self.commit(seq, mine[:a + 1], hidden[s * W: s * W + a + 1] if hidden is not None else None)
            if d:
                seq.stats.windows += 1
                seq.stats.accepted += kept - 1

    def commit(self, seq: Sequence, tokens: list[int], hidden) -> int:
        """Append the accepted tokens (returns how many the stream took); the lane keeps the state
        after the last row that stays. A stream that ends inside the window (EOS, stop, length)
        keeps the state of its last token, so its snapshot is exactly what plain decoding leaves.
        The drafter sees the accepted rows first, so a stream's snapshot has them whatever ends it."""
        sched, p = self.sched, seq.computed
        last = len(tokens) - 1
        if hidden is not None:
            self.observe(seq, p, hidden)
        if not seq.snapshot_at_end:
            sched.cache.keep(seq.lane.index, last)
        for i, tok in enumerate(tokens):
            if seq.snapshot_at_end:  # row by row: the lane holds row i - 1's state already
                sched.cache.keep(seq.lane.index, i, max(i - 1, 0))
            seq.computed = p + i + 1
            sched._append(seq, tok)
            if seq not in sched.active:
                return i + 1
        return len(tokens)
