"""Prompt lookup: propose what followed the latest earlier occurrence of the stream's last tokens.

Model-free and cheap; strong where a reply quotes or edits text it has seen (code, citations).
"""
from __future__ import annotations

import numpy as np

from .base import Drafter


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, longest: int = 4, shortest: int = 2):
        if not 1 <= shortest <= longest:
            raise ValueError(f"n-gram lengths must satisfy 1 <= shortest <= longest, got {shortest}, {longest}")
        self.longest, self.shortest = longest, shortest

    def propose(self, seq, k: int) -> list[int]:
        """The continuation (up to k tokens) of the latest earlier match of the longest tail that
        has one, from `longest` tokens down to `shortest`."""
        toks = np.asarray(seq.tokens, np.int64)
        L = len(toks)
        for n in range(min(self.longest, L - 1), self.shortest - 1, -1):
            # windows starting at 0..L-n-1: every earlier n-gram that has at least one token after it
            starts = np.arange(L - n)
            hit = np.ones(len(starts), bool)
            for j in range(n):
                hit &= toks[starts + j] == toks[L - n + j]
            found = np.flatnonzero(hit)
            if len(found):
                i = int(found[-1]) + n
                return toks[i:i + k].tolist()
        return []
