"""PagePool: hands out page ids from a free list; never one twice, never loses one."""
from __future__ import annotations

import heapq


class PagePool:
    """Pages [first, first+count) of the KV arrays; lowest free id first, so runs are reproducible."""

    def __init__(self, first: int, count: int):
        self.first, self.count = first, count
        self._free = list(range(first, first + count))
        self._used: set[int] = set()

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return len(self._used)

    def alloc(self) -> int | None:
        if not self._free:
            return None
        page = heapq.heappop(self._free)
        self._used.add(page)
        return page

    def release(self, pages: list[int]) -> None:
        for page in pages:
            if page not in self._used:
                raise ValueError(f"page {page} released but not in use")
            self._used.remove(page)
            heapq.heappush(self._free, page)
