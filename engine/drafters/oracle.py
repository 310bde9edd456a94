"""The oracle: proposes a known run's own tokens, so every draft is accepted (the gates' "full
acceptance" case, and the bench's ceiling of what a drafter can gain)."""
from __future__ import annotations

from .base import Drafter


class OracleDrafter(Drafter):
    name = "oracle"

    def __init__(self, runs: list[list[int]] = ()):
        """runs: whole token lists (prompt + reply) of earlier runs; a stream whose tokens so far
        are a prefix of one (same prompt) gets that run's next tokens."""
        self._runs: dict[tuple[int, ...], list[list[int]]] = {}
        for run in runs:
            self.learn(run)

    def learn(self, tokens: list[int]) -> None:
        """Remember one more run (prompt + reply tokens)."""
        self._runs.setdefault(tuple(tokens[:8]), []).append(list(tokens))

    def propose(self, seq, k: int) -> list[int]:
        toks = seq.tokens
        n = len(toks)
        for run in self._runs.get(tuple(toks[:8]), ()):
            if len(run) > n and run[:n] == toks:
                return run[n:n + k]
        return []
