"""Qwen3: Llama with a per-head RMSNorm on q and k before RoPE."""
from __future__ import annotations

from ..rows import Rows
from .llama import Llama


class Qwen3(Llama):
    def load_attention(self, W: dict, pre: str) -> dict:
        out = super().load_attention(W, pre)
        out["q_norm"] = self.b.prepare(W[pre + "q_norm"], "norm")
        out["k_norm"] = self.b.prepare(W[pre + "k_norm"], "norm")
        return out

    def qk(self, layer: dict, q, k, rows: Rows):
        eps = self.cfg.rms_eps
        return super().qk(layer, self.b.rmsnorm(q, layer["q_norm"], eps), self.b.rmsnorm(k, layer["k_norm"], eps), rows)
