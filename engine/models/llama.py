"""Llama: RMSNorm, GQA attention with NeoX RoPE, SwiGLU MLP. The base the other decoders extend."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..kv.cache import Cache
from ..ops.base import Backend
from ..plan import Plan
from ..rows import Rows
from ..weights import Affine, Model, Tensor


def fuse(ws: list[Tensor]) -> Tensor | None:
    """Concatenate weights along the output dim so one GEMV reads them in one pass."""
    if all(isinstance(w, np.ndarray) for w in ws):
        return np.concatenate([w.astype(np.float32) for w in ws], axis=-2)
    if all(isinstance(w, Affine) for w in ws) and len({(w.bits, w.group, w.scales.dtype) for w in ws}) == 1:
        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(w, name) for w in ws], axis=-2)
        return Affine(cat("packed"), cat("scales"), cat("biases"), ws[0].bits, ws[0].group)
    return None  # mixed formats: keep them apart


class Llama:
    def __init__(self, model: Model, backend: Backend, progress: Callable[[float], None] | None = None):
        self.cfg, self.b = model.config, backend
        c, W, p = self.cfg, model.weights, backend.prepare
        self.embed = p(W["embed_tokens"], "embed")
        self.lm_head = self.embed if c.tie_embeddings or "lm_head" not in W else p(W["lm_head"])
        self.norm = p(W["norm"], "norm")
        self.attn_index = {layer: i for i, layer in enumerate(c.attention_layers)}
        self.layers = []
        for i in range(c.layers):
            self.layers.append(self.load_layer(W, i))
            if progress:
                progress((i + 1) / c.layers)

    # --- weights ---------------------------------------------------------------------------
    def load_layer(self, W: dict, i: int) -> dict:
        pre, p = f"layers.{i}.", self.b.prepare
        layer = {"in_norm": p(W[pre + "input_layernorm"], "norm"),
                 "post_norm": p(W[pre + "post_attention_layernorm"], "norm")}
        layer.update(self.load_attention(W, pre + "self_attn."))
        layer.update(self.load_mlp(W, pre + "mlp."))
        return layer

    def load_attention(self, W: dict, pre: str) -> dict:
        qkv = fuse([W[pre + "q_proj"], W[pre + "k_proj"], W[pre + "v_proj"]])
        out = {"o": self.b.prepare(W[pre + "o_proj"])}
        if pre + "q_proj.bias" in W:  # Qwen2-style checkpoints load as llama with q/k/v biases
            bias = np.concatenate([W[pre + n + ".bias"] for n in ("q_proj", "k_proj", "v_proj")])
            out["qkv_bias"] = self.b.prepare(bias, "norm")
        if pre + "o_proj.bias" in W:
            out["o_bias"] = self.b.prepare(W[pre + "o_proj.bias"], "norm")
        if qkv is not None:
            out["qkv"] = self.b.prepare(qkv)
        else:
            out.update(q=self.b.prepare(W[pre + "q_proj"]), k=self.b.prepare(W[pre + "k_proj"]),
                       v=self.b.prepare(W[pre + "v_proj"]))
        return out

    def load_mlp(self, W: dict, pre: str) -> dict:
        gu = fuse([W[pre + "gate_proj"], W[pre + "up_proj"]])
        out = {"down": self.b.prepare(W[pre + "down_proj"])}
        if gu is not None:
            out["gate_up"] = self.b.prepare(gu)
        else:
            out.update(gate=self.b.prepare(W[pre + "gate_proj"]), up=self.b.prepare(W[pre + "up_proj"]))
        return out

    # --- stream state ----------------------------------------------------------------------
    def make_cache(self, backend: Backend, plan: Plan, kv_store: str | None = None) -> Cache:
        """The cache of a plan's streams: K/V pages of every attention layer (+ the scratch page; + a
        drafter's own attention layers, after the model's) and the recurrent slots `state_shapes`
        names (+ a verify window's rows; + a DFlash2 drafter's context rings). kv_store: tests'
        lossless `kv.cache.F32`."""
        c = self.cfg
        return Cache(backend, layers=len(c.attention_layers) + plan.draft_layers, pages=plan.pages_total + 1,
                     page_tokens=plan.page_tokens, kv_heads=c.kv_heads, head_dim=c.head_dim,
                     kv_dtype=kv_store or plan.kv_dtype, lanes=plan.parallel, state_shapes=self.state_shapes(),
                     state_logs=self.state_logs(), draft_tokens=plan.draft_tokens, ring=plan.draft_ring)

    def state_shapes(self) -> list[tuple[tuple[int, ...], ...]]:
        """Per recurrent layer, the shapes of its per-lane arrays: none in a pure transformer."""
        return []

    def state_logs(self) -> list[tuple[tuple[int, ...], ...]]:
        """Per recurrent layer, the shapes of a verify-window row's log of its last array (`Cache`)."""
        return []

    # --- forward ---------------------------------------------------------------------------
    def forward(self, rows: Rows, cache: Cache):
        """Logits (backend array [len(rows.want), vocab]) for the wanted rows; with `rows.hidden`,
        (logits, the final-normed hidden state of every row) for a drafter, or with `rows.taps` the
        outputs of those layers instead, concatenated (the last layer's is the final-normed one,
        as transformers reports it)."""
        b, c = self.b, self.cfg
        x = b.embed(self.embed, b.asarray(rows.tokens))
        residual = None
        taps = {}
        for i, layer in enumerate(self.layers):
            if residual is None:
                h, residual = b.rmsnorm(x, layer["in_norm"], c.rms_eps), x
            else:
                h, residual = b.add_rmsnorm(x, residual, layer["in_norm"], c.rms_eps)
                if i - 1 in rows.taps:
                    taps[i - 1] = residual  # x + residual: layer i - 1's output
            x = self.mixer(i, layer, h, rows, cache)
            h, residual = b.add_rmsnorm(x, residual, layer["post_norm"], c.rms_eps)
            x = self.mlp(layer, h, rows)
        h, _ = b.add_rmsnorm(x, residual, self.norm, c.rms_eps)
        taps[len(self.layers) - 1] = h
        logits = self.head(h[b.asarray(rows.want)] if len(rows.want) != len(rows) else h)
        if not rows.hidden:
            return logits
        return logits, (b.concat([taps[t] for t in rows.taps]) if rows.taps else h)

    def head(self, h):
        return self.b.linear(h, self.lm_head)

    def mixer(self, i: int, layer: dict, h, rows: Rows, cache: Cache):
        return self.attention(self.attn_index[i], layer, h, rows, cache)

    def project(self, layer: dict, h, rows: Rows, names: tuple[str, str, str]):
        """q, k, v projections of h (one fused GEMV where the formats allow)."""
        b = self.b
        if "qkv" in layer:
            out = b.linear(h, layer["qkv"], rows.pad_to, rows.fp16)
        else:
            out = b.concat([b.linear(h, layer[n], rows.pad_to, rows.fp16) for n in names])
        if "qkv_bias" in layer:
            out = out + layer["qkv_bias"]
        sizes = [self.q_width(), self.cfg.kv_heads * self.cfg.head_dim]
        return out[:, : sizes[0]], out[:, sizes[0]: sizes[0] + sizes[1]], out[:, sizes[0] + sizes[1]:]

    def q_width(self) -> int:
        return self.cfg.heads * self.cfg.head_dim

    def qk(self, layer: dict, q, k, rows: Rows):
        """Per-head q and k with RoPE applied."""
        b, c = self.b, self.cfg
        pos = rows.positions  # one object for every layer: a backend makes its RoPE table once a forward
        return b.rope(q, pos, c.rope_theta, c.rotary_dim), b.rope(k, pos, c.rope_theta, c.rotary_dim)

    def attention(self, li: int, layer: dict, h, rows: Rows, cache: Cache):
        b, c, n = self.b, self.cfg, len(rows)
        q, k, v = self.project(layer, h, rows, ("q", "k", "v"))
        q, gate = self.split_gate(q, n)
        q, k = self.qk(layer, q, k.reshape(n, c.kv_heads, c.head_dim), rows)
        v = v.reshape(n, c.kv_heads, c.head_dim)
        # New keys go into the cache before attention reads them: one arithmetic for all arms.
        b.kv_write(cache, li, k, v, rows.tables, rows.positions)
        o = b.attention(q, cache, li, rows.tables, rows.positions, rows.prompt, rows.window, rows.fp16).reshape(n, -1)
        if gate is not None:
            o = b.sigmoid_mul(o, gate)
        o = b.linear(o, layer["o"], rows.pad_to, rows.fp16, feeds_norm="o_bias" not in layer)
        return o + layer["o_bias"] if "o_bias" in layer else o

    def split_gate(self, q, n: int):
        return q.reshape(n, self.cfg.heads, self.cfg.head_dim), None

    def mlp(self, layer: dict, h, rows: Rows):
        b = self.b
        if "gate_up" in layer:
            gu = b.linear(h, layer["gate_up"], rows.pad_to, rows.fp16)
            half = gu.shape[1] // 2
            g, u = gu[:, :half], gu[:, half:]
        else:
            g, u = b.linear(h, layer["gate"], rows.pad_to, rows.fp16), b.linear(h, layer["up"], rows.pad_to, rows.fp16)
        return b.linear(b.silu_mul(g, u), layer["down"], rows.pad_to, rows.fp16, feeds_norm=True)
