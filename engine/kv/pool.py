"""PagePool: hands out page ids from a free list; never one twice, never loses one.

A page may have several holders (a lane and the prompt cache, or two lanes sharing a cached
prefix): it is reference-counted and goes back to the free list when its last holder releases it.
Shared pages are full and never written again, so nobody ever needs a copy on write.
"""
from __future__ import annotations

import heapq


class PagePool:
    """Pages [first, first+count) of the KV arrays; lowest free id first, so runs are reproducible."""

    def __init__(self, first: int, count: int):
        self.first, self.count = first, count
        self._free = list(range(first, first + count))
        self._refs: dict[int, int] = {}

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return len(self._refs)

    def alloc(self) -> int | None:
        if not self._free:
            return None
        page = heapq.heappop(self._free)
        self._refs[page] = 1
        return page

    def share(self, page: int) -> None:
        """One more holder of a page in use."""
        if page not in self._refs:
            raise ValueError(f"page {page} shared but not in use")
        self._refs[page] += 1

    def holders(self, page: int) -> int:
        return self._refs.get(page, 0)

    def release(self, pages: list[int]) -> None:
        for page in pages:
            if page not in self._refs:
                raise ValueError(f"page {page} released but not in use")
            self._refs[page] -= 1
            if not self._refs[page]:
                del self._refs[page]
                heapq.heappush(self._free, page)
