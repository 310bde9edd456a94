"""Rows: what one forward call computes — tokens at absolute positions, each in its lane."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Rows:
    tokens: np.ndarray  # int32 [n]
    positions: np.ndarray  # int32 [n] absolute positions
    tables: np.ndarray  # int32 [n, max_pages]: the page table of each row's lane
    lanes: np.ndarray  # int32 [n]: lane index (recurrent state slot) of each row
    prompt: bool  # True: one lane's prompt chunk; False: decode rows, one per lane
    pad_to: int = 0  # prompt chunks run GEMMs at this fixed row count
    want: np.ndarray | None = None  # rows whose logits are needed (None: all)
    # Decode rows in verify windows: `window` rows per stream, stream by stream (row s·window + j is
    # stream s's window row j, at its position + j); each reads the rows before it in its window.
    window: int = 1
    hidden: bool = False  # the forward also returns the final-normed hidden state of every row (drafters)
    taps: tuple[int, ...] = ()  # with `hidden`: these layers' outputs instead, concatenated (DFlash2)
    fp16: bool = False  # prompt chunks: products may round to fp16 (EngineSettings.prefill_precision)
    # Decode rows whose tokens `choose` will be asked for with these (params, positions): a backend may
    # choose them inside the step (the CUDA graph samples on the device) and hand them to `choose`.
    choose: tuple[list, list[int]] | None = None
    # Decode rows that feed the tokens the step before chose on the device (`Backend.chosen`, the
    # scheduler's run-ahead): `tokens` then flags the rows whose stream a fed token of `ends` ends
    # (1; 0 where it ignores EOS). Such a row steps no recurrent state: its lane is voided (-1).
    fed: object = None
    ends: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.tokens = np.ascontiguousarray(self.tokens, dtype=np.int32)
        self.positions = np.ascontiguousarray(self.positions, dtype=np.int32)
        self.tables = np.ascontiguousarray(self.tables, dtype=np.int32)
        self.lanes = np.ascontiguousarray(self.lanes, dtype=np.int32)
        if self.want is None:
            self.want = np.arange(len(self.tokens), dtype=np.int32)

    def __len__(self) -> int:
        return len(self.tokens)
