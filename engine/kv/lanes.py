"""Lanes: one per stream, each with a page table. A window is a lane whose pages are fixed.

Layout of the KV arrays: the windows' pages first (lane i's window is one contiguous run), then the
pool. Modes: `off` every lane a window; `pages` lane 0 (the engine's own) a window, the rest on the
pool; `all` every lane on the pool, with one window's worth of pages set aside for lane 0. While
lane 0 is idle its reserve is lent to the others; the scheduler takes it back by pausing borrowers.
Pages that only the prompt cache holds (`spare`) count as free: a lane short of pages evicts them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .pool import PagePool


@dataclass
class Lane:
    index: int
    window: bool
    pages: list[int] = field(default_factory=list)
    busy: bool = False


class Spare(Protocol):
    """Pool pages held by someone who gives them up on demand (the prompt cache)."""

    def evictable(self) -> int:
        """Pages that `evict` can return to the pool."""

    def evict(self, pages: int) -> None:
        """Return at least `pages` pages to the pool (least recently used first)."""


class Lanes:
    def __init__(self, parallel: int, context: int, page_tokens: int, mode: str, pool_pages: int):
        self.page_tokens, self.mode = page_tokens, mode
        self.window_pages = -(-context // page_tokens)
        windowed = {"off": parallel, "pages": 1, "all": 0}[mode]
        self.lanes = [Lane(i, i < windowed) for i in range(parallel)]
        for lane in self.lanes[:windowed]:
            lane.pages = list(range(lane.index * self.window_pages, (lane.index + 1) * self.window_pages))
        self.pool = PagePool(windowed * self.window_pages, pool_pages)
        self.reserve = self.window_pages if mode == "all" else 0
        self.spare: Spare | None = None

    @property
    def total_pages(self) -> int:
        return self.pool.first + self.pool.count

    def acquire(self) -> Lane | None:
        """The lowest free lane: a lone request always runs as the engine's own stream."""
        for lane in self.lanes:
            if not lane.busy:
                lane.busy = True
                return lane
        return None

    def available(self, lane: Lane) -> int:
        """Pool pages this lane may still take: others leave a busy lane 0's reserve alone, and
        may borrow it while lane 0 is idle."""
        return self._free() - self._held_back(lane)

    def _free(self) -> int:
        return self.pool.free + (self.spare.evictable() if self.spare is not None else 0)

    def _held_back(self, lane: Lane) -> int:
        if lane.index == 0 or not self.lanes[0].busy:
            return 0
        return max(0, self.reserve - len(self.lanes[0].pages))

    def lent(self) -> int:
        """Pages of lane 0's reserve that other lanes hold (borrowed while it was idle)."""
        own = 0 if self.lanes[0].window else len(self.lanes[0].pages)
        return max(0, self.reserve - own - self._free())

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_tokens)

    def missing(self, lane: Lane, tokens: int) -> int:
        """Pages the lane lacks for `tokens` positions (a window lacks none within its length)."""
        if lane.window:
            return 0 if tokens <= len(lane.pages) * self.page_tokens else 1 << 30
        return max(0, self.pages_for(tokens) - len(lane.pages))

    def fits(self, lane: Lane, tokens: int) -> bool:
        """Whether `ensure(lane, tokens)` would succeed (nothing is taken)."""
        return self.missing(lane, tokens) <= (self.available(lane) if not lane.window else 0)

    def ensure(self, lane: Lane, tokens: int) -> bool:
        """Give the lane pages for `tokens` positions; False (nothing taken) if the pool is short."""
        if lane.window:
            return tokens <= len(lane.pages) * self.page_tokens
        need = self.pages_for(tokens) - len(lane.pages)
        if need <= 0:
            return True
        if need > self.available(lane):
            return False
        short = need + self._held_back(lane) - self.pool.free
        if short > 0:
            self.spare.evict(short)
        lane.pages.extend(self.pool.alloc() for _ in range(need))
        return True

    def alloc(self) -> int | None:
        """One pool page outside any lane (a copy for the prompt cache), evicting if need be."""
        if not self.pool.free and self.spare is not None and self.spare.evictable():
            self.spare.evict(1)
        return self.pool.alloc()

    def release(self, lane: Lane) -> None:
        if not lane.window:
            self.pool.release(lane.pages)
            lane.pages = []
        lane.busy = False

    def table(self, lane: Lane) -> np.ndarray:
        """The lane's page table padded to a window's length (padding is never read)."""
        t = np.zeros(self.window_pages, np.int32)
        t[: len(lane.pages)] = lane.pages
        return t

    def pages_used(self) -> int:
        return self.pool.used + sum(len(lane.pages) for lane in self.lanes if lane.window and lane.busy)
