"""Scheduler: streams on lanes; each step admits, runs prompt chunks, one batched decode, samples, emits.

A sequence's tokens are prompt + generated; `computed` of them have K/V in its lane's part of the
cache. Prompt chunks start at absolute multiples of the chunk size, so a prompt is cut the same way
whatever else runs. The scheduler deals in ids, lanes and rows; each sequence's TextStream turns
its ids into text. Runs on the engine thread (or the caller's, for the CLI and the gates): no
locking here. Pool pressure: `pausing` says who waits and who pauses (to host memory, exactly).

Run-ahead (engine/run_ahead.py, a GPU's graphs): while the same streams decode step after step, the
next step is queued on the tokens the device chose before the host reads them.

Errors: a piece of a step that raises fails only the streams it computed for; a batched decode
step that raises is run again one row at a time (each row's recurrent state put back by
`state_checkpoints`), so only the stream that raises alone fails. An error the backend calls a lost
device (`Backend.device_lost`) leaves `step` as a DeviceLostError: the engine restarts.
"""
from __future__ import annotations

import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import drafters, pausing
from .drafters.verify import DraftStats, Verifier
from .errors import DeviceLostError
from .events import Event, Failed, Finished, Queued, Started, Token
from .kv import Lane, Lanes, Snapshot, SnapshotError
from .ops.base import Backend
from .plan import Plan
from .prompt_cache import PromptCache
from .rows import Rows
from .run_ahead import Ahead, RunAhead
from .settings import EngineSettings, SamplingParams
from .state_checkpoints import StateCheckpoints
from .textstream import TextStream
from .thinking import Splitter


@dataclass
class StepStats:
    """One decode step, for a step observer: its rows' positions and its time on the device, read
    from two marks in the backend's work (`Backend.mark`) when asked, so observing never stalls it."""
    positions: list[int]
    timer: Callable[[], float]
    window: int = 1  # rows per stream (k + 1 in a verify window)

    @property
    def seconds(self) -> float:
        return self.timer()


@dataclass
class Sequence:
    id: int
    tokens: list[int]  # prompt + generated
    prompt_len: int
    params: SamplingParams
    on_event: Callable[[Event], None]
    text: TextStream
    snapshot_at_end: bool = False
    resume: Snapshot | None = None
    lane: Lane | None = None
    computed: int = 0
    think: Splitter | None = None  # splits a thinking model's reply into reasoning and content
    t_start: float = 0.0
    t_first: float = 0.0
    prompt_done: bool = False
    draft: object = None  # the drafter's own per-stream state (engine/drafters)
    stats: DraftStats = field(default_factory=DraftStats)
    arrival: int = 0  # order of `Scheduler.add`: the youngest stream pauses first
    cold: bool = True  # every position so far computed as a cold run computes it (prompt-cache pages)

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def target(self) -> int:
        """Positions to compute before decoding: all but the last sampled token (not yet fed)."""
        return len(self.tokens) - (1 if self.generated else 0)


class Scheduler:
    def __init__(self, settings: EngineSettings, plan: Plan, model, backend: Backend, tokenizer,
                 kv_store: str | None = None, drafter_weights=None):
        """kv_store: the K/V storage of the cache, plan.kv_dtype unless a test asks for `kv.cache.F32`;
        drafter_weights: a DFlash2 drafter's prepared checkpoint (`Runner.drafter_weights`)."""
        settings = settings.with_chunk(backend.prompt_chunk)  # fixed for the scheduler: prompts cut one way
        self.s, self.plan, self.model, self.b, self.tok = settings, plan, model, backend, tokenizer
        self.lanes = Lanes(settings.parallel, settings.context, settings.page_tokens, settings.paging, plan.pool_pages)
        self.cache = model.make_cache(backend, plan, kv_store)  # this scheduler's streams' state, and only theirs
        self.checkpoints = StateCheckpoints(self.cache, self.lanes)
        self.prompt_cache = None
        if plan.prompt_cache_bytes:
            self.prompt_cache = PromptCache(plan.prompt_cache_bytes, plan.page_bytes,
                                            max(settings.prefill_chunk, settings.page_tokens), self.lanes, self.cache)
        self.waiting: deque[Sequence] = deque()
        self.active: list[Sequence] = []
        # Whether prompt chunks were launched since the last `_settle`, and the streams whose prompt one
        # of them ended (their first token is chosen once the chunk has run).
        self._reading = False
        self._firsts: list[tuple[Sequence, object]] = []
        self.snapshots: dict[int, Snapshot] = {}
        self._arrivals = 0
        # Positions computed so far: by prompt chunks and by decode steps (monotone; a pause loses none).
        self.prompt_positions = 0
        self.decode_positions = 0
        # Called after every decode step with its StepStats (whose time is read later: no synchronisation).
        self.step_observer: Callable[[StepStats], None] | None = None
        drafter = drafters.make(plan.drafter, model, backend, drafter_weights)
        self.verifier = Verifier(self, drafter, plan.draft_tokens) if drafter else None  # speculative decoding
        # Called with the rows of every forward once it ran (cache and state written), before its
        # tokens are chosen; what it raises, the forward raised (the fault-injection hook).
        self.after_forward: Callable[[Rows], None] | None = None
        # Steady decode runs ahead where the backend overlaps; a public switch for tests (the CPU's
        # order of work is the same either way) and the bench's A/B.
        self.run_ahead = backend.overlaps
        self.ahead = RunAhead(self)
        # Streams whose recurrent state a step queued ahead may have moved when its launch raised: put
        # back from their checkpoint before their next step.
        self.stale: set[int] = set()

    def warm_decode(self) -> int:
        """Every decode step shape of up to the plan's streams prepared now (graphs captured on the
        GPU), so that no stream's step waits for a capture when another tab joins; the engine calls
        it at start. Returns the graphs captured."""
        shapes = [(1, False, ())] if self.verifier is None else self.verifier.decode_shapes()
        return self.b.warm_decode(self.model, self.cache, self.lanes.window_pages, self.plan.parallel, shapes)

    # --- requests ------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a stream; SnapshotError when the snapshot it resumes from does not fit this cache."""
        if seq.resume is not None and (why := self.cache.mismatch(seq.resume.cache)) is not None:
            raise SnapshotError(f"the snapshot does not fit this engine: {why}")
        self._arrivals += 1
        seq.arrival = self._arrivals
        self.waiting.append(seq)
        if len(self.active) + len(self.waiting) > len(self.lanes.lanes):
            seq.on_event(Queued(seq.id, len(self.waiting) - 1))

    def cancel(self, rid: int, reason: str = "cancelled") -> None:
        self.ahead.drain()
        self._settle()
        for seq in list(self.waiting):
            if seq.id == rid:
                self.waiting.remove(seq)
                self._finish(seq, reason)
        for seq in list(self.active):
            if seq.id == rid:
                self._finish(seq, reason)

    def cancel_all(self, reason: str = "cancelled") -> None:
        self.ahead.drain()
        self._settle()
        for seq in list(self.waiting) + list(self.active):
            self.cancel(seq.id, reason)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.active)

    # --- one step ------------------------------------------------------------------------
    def step(self) -> None:
        """Raises DeviceLostError when the backend lost its device (every stream is then lost).
        While a prompt chunk runs, streams that are decoding take steps beside it; anything else
        (admission, pauses, the next chunk) waits for it."""
        if self.ahead.step():
            return
        self.ahead.drain()
        if self._reading and self.verifier is None and self.b.prompt_pending():
            ready = self._ready()
            if ready:
                self._decode_isolated(ready)
                return
        self._settle()
        own = next((q for q in self.active if q.lane.index == 0), None)
        if own is not None:
            self._reclaim(pausing.next_end(own, self.s.prefill_chunk))
        self._admit()
        moved = False
        for seq in [q for q in self.active if q.computed < q.target]:
            moved |= self._guarded([seq], self._prompt_chunk, seq)  # a prompt's failure is its stream's alone
        if self.verifier is not None:
            self._settle()  # a drafter reads the chunks' hidden states in its next window
        ready = self._ready()
        if ready:
            self._decode_isolated(ready)
            moved = True
        if not moved and self.active:  # nobody could place its next piece
            self._pause(pausing.youngest(self.active))

    def _ready(self) -> list[Sequence]:
        """The streams that decode this step: prompt read, first token out, a page for the next."""
        return [q for q in self.active if q.prompt_done and q.computed == q.target
                and self.lanes.ensure(q.lane, q.computed + 1)]

    def _settle(self) -> None:
        """Work from here on comes after the prompt chunks launched so far; the streams whose
        prompt they ended get their first token."""
        if not self._reading:
            return
        self._reading = False
        self.b.join_prompt()
        firsts, self._firsts = self._firsts, []
        for seq, logits in firsts:
            if seq in self.active:
                self._guarded([seq], self._first_token, seq, logits)

    def _admit(self) -> None:
        C = self.s.prefill_chunk
        while self.waiting and not pausing.short(self.lanes, self.active, C):
            lane = self.lanes.acquire()
            if lane is None:
                return
            seq = self.waiting.popleft()
            self.cache.reset(lane.index)
            cold = seq.cold
            reused = self._cached(seq, lane)
            end = pausing.next_end(seq, C)
            if lane.index == 0:
                self._reclaim(end)  # the paused borrowers queue ahead of the others
            if not self.lanes.ensure(lane, end):
                self.lanes.release(lane)
                seq.computed, seq.cold = 0, cold
                self.waiting.appendleft(seq)
                seq.on_event(Queued(seq.id, 0, "waiting for KV pages (the pool is full)"))
                return
            seq.lane = lane
            seq.t_start = seq.t_start or time.perf_counter()
            self.active.append(seq)
            if seq.resume:
                reused = self._restore(seq)
            seq.on_event(Started(seq.id, lane.index, seq.prompt_len, reused))

    def _cached(self, seq: Sequence, lane: Lane) -> int:
        """Take what the prompt cache holds of a fresh prompt into its lane; positions reused."""
        if self.prompt_cache is None or seq.resume is not None or seq.computed or seq.generated:
            return 0
        hit = self.prompt_cache.lookup(seq.tokens, self.cache.stateful)
        if hit is None or not self.prompt_cache.take(lane, hit):
            return 0
        seq.computed, seq.cold = hit.n, hit.cold
        return hit.n

    def _reclaim(self, tokens: int) -> None:
        """Give lane 0 what it lent while idle, for `tokens` positions: pause the youngest borrowers."""
        while (victim := pausing.borrower(self.lanes, self.active, tokens)) is not None:
            self._pause(victim, "paused: the engine's own stream took back its reserved KV pages; "
                                "it continues where it stopped")

    def _rows(self, seqs: list[Sequence], prompt: bool, start: int = 0, end: int = 0) -> Rows:
        if prompt:
            seq = seqs[0]
            pos = np.arange(start, end)
            return Rows(np.array(seq.tokens[start:end]), pos, np.tile(self.lanes.table(seq.lane), (len(pos), 1)),
                        np.full(len(pos), seq.lane.index), True, self.s.prefill_chunk,
                        np.array([len(pos) - 1]), fp16=self.s.prefill_precision == "fp16")
        return self.decode_rows(seqs, np.array([q.tokens[q.computed] for q in seqs]))

    def decode_rows(self, seqs: list[Sequence], tokens: np.ndarray, ahead: int = 0) -> Rows:
        """Decode rows, one a stream, at each stream's next position; `ahead`: steps queued before
        these whose tokens are not applied yet (run-ahead)."""
        return Rows(tokens, np.array([q.computed + ahead for q in seqs]),
                    np.stack([self.lanes.table(q.lane) for q in seqs]), np.array([q.lane.index for q in seqs]), False)

    def _run_chunk(self, seq: Sequence):
        """The next prompt chunk, [computed, next multiple of the chunk size); None if no pages."""
        C = self.s.prefill_chunk
        start = seq.computed
        end = min(seq.target, (start // C + 1) * C)
        if not self.lanes.ensure(seq.lane, end):
            return None
        rows = self._rows([seq], True, start, end)
        rows.hidden = self.verifier is not None and self.verifier.wants_hidden
        rows.taps = self.verifier.taps if rows.hidden else ()
        self._reading = True
        with self.b.prompt_work():
            logits = self.model.forward(rows, self.cache)
            if self.after_forward is not None:
                self.after_forward(rows)
            self.prompt_positions += end - start
            seq.computed = end
            if rows.hidden:
                logits, hidden = logits
                self.verifier.observe(seq, start, hidden)
            pc = self.prompt_cache
            if pc is not None and seq.cold and self.cache.stateful and end == (seq.target - 1) // pc.granule * \
                    pc.granule:
                pc.keep_state(seq.tokens[:end], self.cache.read(seq.lane, 0))  # the boundary a repeat needs
        return logits

    def _prompt_chunk(self, seq: Sequence) -> bool:
        """The stream's next prompt chunk; False when its pages are not there."""
        logits = self._run_chunk(seq)
        if logits is None:
            return False
        if seq.computed == seq.target:
            self._firsts.append((seq, logits))
        return True

    def _first_token(self, seq: Sequence, logits) -> None:
        """The prompt is read (its last chunk has run): the first token, unless it is a resumed reply's."""
        seq.prompt_done = True
        tok = None if seq.generated else self._choose(logits, [seq])[0]
        seq.t_first = time.perf_counter()  # after the choice: the device has finished the prompt
        if self.prompt_cache is not None and seq.cold:
            self.prompt_cache.keep_pages(seq.lane, seq.tokens, seq.target)
        if tok is not None:
            self._append(seq, tok)

    def _decode(self, seqs: list[Sequence]) -> None:
        if self.verifier is not None:
            return self.verifier.step(seqs)
        rows = self._rows(seqs, False)
        rows.choose = self._choice(seqs)
        logits = self.run_decode(rows)
        chosen = self.b.chosen(logits, *rows.choose)
        if chosen is None:
            return self.apply(seqs, self.b.choose(logits, *rows.choose))
        queued = self.ahead.after(seqs, chosen)
        self.apply(seqs, self.b.take(chosen), queued)

    def apply(self, seqs: list[Sequence], tokens: list[int], queued: Ahead | None = None, void=()) -> None:
        """A decode step's tokens to its streams (not to those that left since, nor to `void` rows).
        A stream that stops has a void row in the step `queued` after it."""
        for seq, tok in zip(seqs, tokens):
            if seq.id in void or seq not in self.active:
                continue
            seq.computed += 1
            self._append(seq, tok)
            if queued is not None and seq not in self.active:
                queued.void.add(seq.id)

    def run_decode(self, rows: Rows):
        """One decode forward (plain rows or verify windows), timed for the step observer."""
        if self.step_observer is None:
            out = self.b.decode_step(self.model, rows, self.cache)
        else:
            b, start = self.b, self.b.mark()
            out = b.decode_step(self.model, rows, self.cache)
            end = b.mark()
            self.step_observer(StepStats(rows.positions.tolist(), lambda: b.seconds(start, end), rows.window))
        if self.after_forward is not None:
            self.after_forward(rows)
        self.decode_positions += int((rows.lanes >= 0).sum())
        return out

    def _decode_isolated(self, seqs: list[Sequence]) -> None:
        """A batched decode step; if it raises, the streams it had not yet given a token get their
        recurrent state back (`StateCheckpoints`) and run again one at a time, so only the stream
        that raises alone fails."""
        for seq in [q for q in seqs if q.id in self.stale]:
            self.stale.discard(seq.id)
            self._guarded([seq], self.checkpoints.restore, seq, seq.computed, self._replay)
        seqs = [q for q in seqs if q in self.active]
        if len(seqs) == 1:
            return self._guarded(seqs, self._decode, seqs)
        before = [q.computed for q in seqs]
        self.checkpoints.keep(seqs)
        try:
            self._decode(seqs)
        except Exception as e:
            self.raise_if_lost(e)
            traceback.print_exc()
            for seq, n in zip(seqs, before):
                if seq in self.active and seq.computed == n:
                    self._guarded([seq], self._decode_again, seq, n)

    def _decode_again(self, seq: Sequence, n: int) -> None:
        self.checkpoints.restore(seq, n, self._replay)
        self._decode([seq])

    def _replay(self, rows: Rows):
        """A decode forward that puts recurrent state back (`StateCheckpoints.restore`)."""
        return self.b.decode_step(self.model, rows, self.cache)

    def _choose(self, logits, seqs: list[Sequence]) -> list[int]:
        return self.b.choose(logits, *self._choice(seqs))

    @staticmethod
    def _choice(seqs: list[Sequence]) -> tuple[list, list[int]]:
        """`choose`'s (params, positions) for the streams' next tokens: keyed by the position sampled."""
        return [q.params for q in seqs], [len(q.tokens) for q in seqs]

    # --- tokens out ----------------------------------------------------------------------
    def _append(self, seq: Sequence, tok: int) -> None:
        seq.tokens.append(tok)
        p = seq.params
        if tok in self.tok.eos_ids and not p.ignore_eos:
            seq.on_event(Token(seq.id, tok, "", seq.generated))
            return self._finish(seq, "eos")
        self._emit(seq, tok, seq.text.push(tok))
        if seq.text.stopped:
            self._finish(seq, "stop")
        elif seq.generated >= p.max_tokens or len(seq.tokens) >= self.s.context:
            self._finish(seq, "length")

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.stale.discard(seq.id)
        if seq in self.active:
            if seq.snapshot_at_end:
                self.snapshots[seq.id] = self._snapshot(seq)
            if self.prompt_cache is not None and seq.computed:
                state = self.cache.read(seq.lane, 0) if self.cache.stateful else None
                self.prompt_cache.keep_end(seq.lane, seq.tokens, seq.computed, state)
            self.active.remove(seq)
            self.lanes.release(seq.lane)
        elif seq.snapshot_at_end and seq.resume is not None:  # ended while paused (or before a restore)
            r = seq.resume  # a file's restore may hold it on the device: the writer thread saves host arrays
            self.snapshots[seq.id] = Snapshot(r.tokens, r.prompt_len, r.cache.on_host(self.b.to_host))
        now = time.perf_counter()
        prompt_s = (seq.t_first - seq.t_start) if seq.t_first else 0.0
        decode_s = now - seq.t_first if seq.t_first else 0.0
        n = seq.generated
        self._emit(seq, Token.NO_TOKEN, seq.text.finish())  # held back: stop-string prefix, partial character
        seq.on_event(Finished(seq.id, reason, seq.think.content if seq.think else seq.text.text, n, seq.prompt_len,
                              seq.prompt_len / prompt_s if prompt_s > 0 else 0.0,
                              (n - 1) / decode_s if decode_s > 0 and n > 1 else 0.0, seq.stats.mean_length,
                              seq.think.reasoning if seq.think else "", seq.think.tokens if seq.think else 0))

    def _emit(self, seq: Sequence, tok: int, text: str) -> None:
        """One token's final text to its caller, split into reasoning and content for a thinking model;
        NO_TOKEN: the end of the reply (an event only if something was held back)."""
        reasoning, thinking = "", False
        if seq.think is not None:
            reasoning, text, thinking = seq.think.take(text, end=tok == Token.NO_TOKEN)
        if tok != Token.NO_TOKEN or text or reasoning:
            seq.on_event(Token(seq.id, tok, text, seq.generated, reasoning, thinking))

    def _guarded(self, seqs: list[Sequence], fn, *args) -> bool:
        """Run one piece of a step; if it raises, only the streams it computed for fail. Returns
        what `fn` returned (True for None), or True after a failure: either way the step moved."""
        try:
            done = fn(*args)
        except Exception as e:
            self.raise_if_lost(e)
            traceback.print_exc()
            for seq in seqs:
                self.fail(seq, f"engine error: {type(e).__name__}: {e}")
            return True
        return done is not False

    def raise_if_lost(self, e: Exception) -> None:
        if isinstance(e, DeviceLostError):
            raise e
        if self.b.device_lost(e):
            raise DeviceLostError(f"the {self.b.device} reported a fault ({type(e).__name__}: {e})") from e

    def fail(self, seq: Sequence, message: str) -> None:
        if seq in self.active:
            self.active.remove(seq)
            self.lanes.release(seq.lane)
        seq.on_event(Failed(seq.id, message))

    def _pause(self, seq: Sequence, reason: str = "paused: the KV pool is full; it continues where it "
                                                     "stopped when pages free up") -> None:
        """Move the stream's state to host memory and give its lane back; it queues first."""
        if seq.computed:
            seq.resume = self._snapshot(seq)
        self.active.remove(seq)
        self.lanes.release(seq.lane)
        seq.lane, seq.computed, seq.prompt_done = None, 0, False
        self.waiting.appendleft(seq)
        seq.on_event(Queued(seq.id, 0, reason))

    def prompt_logits(self, ids: list[int]) -> np.ndarray:
        """Float32 logits of the last position of a prompt, run in chunks on a free lane."""
        seq = Sequence(0, list(ids), len(ids), SamplingParams(temperature=0), lambda e: None,
                       TextStream(self.tok.stream(), []))
        seq.lane = self.lanes.acquire()
        self.cache.reset(seq.lane.index)
        try:
            while seq.computed < seq.target:
                logits = self._run_chunk(seq)
            self._settle()
            return self.b.to_host(logits)[0].astype(np.float32)
        finally:
            self.lanes.release(seq.lane)

    # --- snapshots -----------------------------------------------------------------------
    def _snapshot(self, seq: Sequence) -> Snapshot:
        return Snapshot(list(seq.tokens), seq.prompt_len, self.cache.read(seq.lane, seq.computed))

    def _restore(self, seq: Sequence) -> int:
        """Put the stream's snapshot into its lane (admission gave it the pages); it goes on from
        there: a prompt read part-way reads on, a stream at its last token decodes. Returns the
        positions restored."""
        snap, seq.resume = seq.resume, None
        self.cache.write(seq.lane, snap.cache)
        seq.computed = snap.cache.n
        seq.prompt_done = seq.computed >= seq.target
        if seq.prompt_done and not seq.t_first:
            seq.t_first = time.perf_counter()
        return seq.computed
