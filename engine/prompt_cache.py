"""The prompt cache: full K/V pages of earlier streams, reused by a request whose prompt shares
their prefix, within a byte budget (least recently used first out).

Two kinds of entry, both keyed by a hash of the token ids they hold:

- **Cold pages**: full pages a prompt computed the way a cold run computes them (chunks from
  position 0 at absolute multiples of the chunk size), keyed by the tokens up to each page's end.
  A hit at a boundary b, a multiple of max(chunk, page), computes the rest from b exactly as a
  cold run would, so it gives the cold run's output. Hybrid models also need the recurrent state
  at b: it is kept at one boundary per stream, the last one before its prompt's end (what a repeat
  of the prompt or a longer prompt starting with it needs).
- **Stream ends**: a finished stream's pages up to its last computed position n (the last,
  partial page copied on a hit) and its recurrent state at n. A prompt that starts with those n
  tokens goes on from n, exactly as the same stream continued would: this is a conversation's
  next turn, its history's pages written by decode.

Cached pages are pool pages that no stream may need to hold: the pool counts them as free, and a
lane short of pages evicts them (`Lanes.spare`). Pages are shared by reference (a page is
immutable once full, and no stream writes below its own start); a window lane copies instead.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import xxhash

from .kv import Cache, Lane, Lanes, LaneState


def prefix_keys(tokens: list[int], page_tokens: int, upto: int) -> list[str]:
    """The keys of the full pages of tokens[:upto]: the hash of the ids up to each page's end."""
    h = xxhash.xxh3_128()
    ids = np.asarray(tokens[: upto - upto % page_tokens], np.int32)
    keys = []
    for end in range(page_tokens, len(ids) + 1, page_tokens):
        h.update(ids[end - page_tokens:end].tobytes())
        keys.append(h.hexdigest())
    return keys


def tokens_key(tokens: list[int]) -> str:
    return xxhash.xxh3_128_hexdigest(np.asarray(tokens, np.int32).tobytes())


@dataclass
class Hit:
    """What a request takes from the cache: positions 0..n-1 and the state after them."""
    n: int
    pages: list[int]  # full pages, shared
    tail: int | None = None  # a page to copy for positions [n - n % P, n) (a stream end)
    state: LaneState | None = None  # the recurrent state at n (hybrid models)
    cold: bool = True  # what follows is computed as a cold run computes it


@dataclass
class _Entry:
    pages: list[int]
    state: LaneState | None = None
    n: int = 0
    tail: int | None = None
    cold: bool = True
    owned: list[int] = field(default_factory=list)  # the pages this entry holds a reference on
    tokens: np.ndarray | None = None  # a stream end's ids, its last sampled token included

    @property
    def nbytes(self) -> int:
        return self.state.nbytes if self.state is not None else 0


class PromptCache:
    def __init__(self, budget_bytes: int, page_bytes: int, granule: int, lanes: Lanes, cache: Cache):
        """granule: hits of cold pages land on its multiples (max(prefill chunk, page size))."""
        self.budget, self.page_bytes, self.granule = budget_bytes, page_bytes, granule
        self.P = lanes.page_tokens
        self.lanes, self.cache, self.pool = lanes, cache, lanes.pool
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()  # LRU first
        self._bytes = 0
        self._refs: Counter[int] = Counter()  # references the entries hold, per page
        self.hits = 0
        self.reused = 0  # positions taken from the cache instead of computed
        lanes.spare = self

    # --- the pool's side ----------------------------------------------------------------------
    def evictable(self) -> int:
        """Pages no lane holds: dropping their entries frees them."""
        return sum(1 for p, n in self._refs.items() if self.pool.holders(p) == n)

    def evict(self, pages: int) -> None:
        freed = self.pool.free
        while self._entries and self.pool.free - freed < pages:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[str, str]) -> None:
        e = self._entries.pop(key)
        self.pool.release(e.owned)
        self._refs.subtract(e.owned)
        for p in e.owned:
            if not self._refs[p]:
                del self._refs[p]
        self._bytes -= len(e.owned) * self.page_bytes + e.nbytes

    @property
    def nbytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        while self._entries:
            self._drop(next(iter(self._entries)))

    def _put(self, key: tuple[str, str], entry: _Entry) -> None:
        if key in self._entries:
            self._entries.move_to_end(key)
            self.pool.release(entry.owned)
            return
        size = len(entry.owned) * self.page_bytes + entry.nbytes
        while self._entries and self._bytes + size > self.budget:
            self._drop(next(iter(self._entries)))
        if self._bytes + size > self.budget:
            self.pool.release(entry.owned)
            return
        self._entries[key] = entry
        self._refs.update(entry.owned)
        self._bytes += size

    def _hold(self, lane: Lane, pages: list[int]) -> list[int] | None:
        """References the cache holds on a lane's pages: shared, or copied out of a window."""
        if not lane.window:
            for p in pages:
                self.pool.share(p)
            return list(pages)
        copies = []
        for _ in pages:
            p = self.lanes.alloc()
            if p is None:
                self.pool.release(copies)
                return None
            copies.append(p)
        self.cache.copy_pages(pages, copies)
        return copies

    # --- what streams leave -------------------------------------------------------------------
    def keep_pages(self, lane: Lane, tokens: list[int], upto: int) -> None:
        """Index the lane's full pages of tokens[:upto], computed as a cold prompt computes them."""
        for i, key in enumerate(prefix_keys(tokens, self.P, upto)):
            if ("page", key) in self._entries:
                self._entries.move_to_end(("page", key))
                continue
            held = self._hold(lane, [lane.pages[i]])
            if held is None:
                return
            self._put(("page", key), _Entry(held, owned=held))

    def keep_state(self, tokens: list[int], state: LaneState) -> None:
        """The recurrent state after tokens (a cold boundary of a prompt)."""
        self._put(("state", tokens_key(tokens)), _Entry([], state))

    def keep_end(self, lane: Lane, tokens: list[int], n: int, state: LaneState | None) -> None:
        """A finished stream's first n positions (its pages, its state at n)."""
        full = n // self.P
        held = self._hold(lane, lane.pages[: full + (1 if n % self.P else 0)])
        if held is None:
            return
        tail = held[full] if n % self.P else None
        self._put(("end", tokens_key(tokens[:n])), _Entry(held[:full], state, n, tail, False, owned=held,
                                                           tokens=np.asarray(tokens, np.int32)))

    def ends(self) -> Iterator[np.ndarray]:
        """The token ids of the stream ends kept, newest first (a reply to continue may be one)."""
        for (kind, _), e in reversed(self._entries.items()):
            if kind == "end" and e.tokens is not None:
                yield e.tokens

    # --- what a request takes -----------------------------------------------------------------
    def lookup(self, ids: list[int], stateful: bool) -> Hit | None:
        """The longest reuse for a prompt: a stream end it continues, or cold pages up to a
        multiple of the granule (with the state there, for hybrid models); at least one position
        is always left to compute (its logits give the first token)."""
        best: Hit | None = None
        for (kind, key), e in self._entries.items():
            if kind == "end" and len(ids) > e.n and (best is None or e.n > best.n) and tokens_key(ids[:e.n]) == key:
                best = Hit(e.n, e.pages, e.tail, e.state, cold=False)
        keys = prefix_keys(ids, self.P, len(ids) - 1)
        held = 0
        while held < len(keys) and ("page", keys[held]) in self._entries:
            held += 1
        b = (held * self.P) // self.granule * self.granule
        while b > 0 and (best is None or b > best.n):
            state = self._entries.get(("state", tokens_key(ids[:b]))) if stateful else None
            if not stateful or state is not None:
                pages = [self._entries[("page", k)].pages[0] for k in keys[: b // self.P]]
                best = Hit(b, pages, None, state.state if state else None, cold=True)
                break
            b -= self.granule
        if best is None:
            return None
        self._touch(ids, best)
        return best

    def _touch(self, ids: list[int], hit: Hit) -> None:
        if not hit.cold:
            self._entries.move_to_end(("end", tokens_key(ids[: hit.n])))
            return
        for k in prefix_keys(ids, self.P, hit.n):
            self._entries.move_to_end(("page", k))
        if hit.state is not None:
            self._entries.move_to_end(("state", tokens_key(ids[: hit.n])))

    def take(self, lane: Lane, hit: Hit) -> bool:
        """Put a hit into a fresh lane: its pages (shared, or copied into a window), the tail page
        copied, the state written. False (nothing taken) when no page is free for the copy."""
        if lane.window:
            self.cache.copy_pages(hit.pages + ([hit.tail] if hit.tail is not None else []),
                                  lane.pages[: len(hit.pages) + (hit.tail is not None)])
        else:
            # Held before the tail's page is allocated: that allocation may evict the hit's own entry.
            pinned = hit.pages + ([hit.tail] if hit.tail is not None else [])
            for p in pinned:
                self.pool.share(p)
            tail = self.lanes.alloc() if hit.tail is not None else None
            if hit.tail is not None and tail is None:
                self.pool.release(pinned)
                return False
            lane.pages = list(hit.pages)
            if tail is not None:
                self.cache.copy_pages([hit.tail], [tail])
                lane.pages.append(tail)
                self.pool.release([hit.tail])
        if hit.state is not None:
            self.cache.write(lane, hit.state)
        self.hits += 1
        self.reused += hit.n
        return True
