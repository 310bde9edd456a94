"""DFlash2: a block-diffusion drafter conditioned on the target's hidden states (z-lab's DFlash v2).

A separate small checkpoint of Qwen3-style layers with no embedding or head of its own. Each step
it drafts a whole block in one forward: row 0 is the stream's last committed token, the rest its
`mask_token_id`, all embedded by the target (times `input_embedding_scale`), at positions p..p+B-1.

- Context: the outputs of the target layers `target_layer_ids` (concatenated, one row per position
  the target computed) become c = hidden_norm(fc(taps)); in every layer the context's keys and
  values are k_norm(k_proj(c)) with RoPE and v_proj(c). They are computed once, when the target
  hands over its rows (prompt chunks, accepted window rows), into the stream's context ring in the
  cache (`Cache.ring_*`: the last `window` positions per layer, per lane; snapshots carry it).
- A layer: x += attn(conv(input_layernorm(x))), x += mlp(conv(post_attention_layernorm(x))), where
  attention's queries are the block's, its keys and values the ring's (within the sliding window)
  and the block's own (the block rows see each other), and v2's two-tap dynamic convs (a base
  kernel plus one projected from the normed input, per group of channels) run before and after
  each sublayer, inside the block only.
- Drafts: the final-normed rows 1..B-1 through the target's head, times `output_multiplier`,
  tanh-softcapped; v2's candidate selector walks the block left to right choosing among each
  position's top-k logits by unary score + Σ_r pred[prev]·proj(h)·succ[cand]. Drafts are always
  the greedy path: the verify window accepts exactly the tokens plain decoding would choose.

The drafter only proposes; a wrong draft costs a rejected row, never a token.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..models.llama import fuse
from .base import Drafter
from .dflash2_config import DFlashConfig


class DFlash2Weights:
    """A checkpoint's weights prepared on a backend, shared by every scheduler of one loaded model."""

    def __init__(self, cfg: DFlashConfig, W: dict, backend):
        p = backend.prepare
        self.cfg = cfg
        self.fc, self.hidden_norm, self.norm = p(W["fc"]), p(W["hidden_norm"], "norm"), p(W["norm"], "norm")
        self.layers = []
        for i in range(cfg.layers):
            pre, a = f"layers.{i}.", f"layers.{i}.self_attn."
            L = {"in_norm": p(W[pre + "input_layernorm"], "norm"), "post_norm": p(W[pre + "post_attention_layernorm"],
                                                                                     "norm"),
                 "q": p(W[a + "q_proj"]), "kv": p(fuse([W[a + "k_proj"], W[a + "v_proj"]])), "o": p(W[a + "o_proj"]),
                 "q_norm": p(W[a + "q_norm"], "norm"), "k_norm": p(W[a + "k_norm"], "norm"),
                 "gate_up": p(fuse([W[pre + "mlp.gate_proj"], W[pre + "mlp.up_proj"]])),
                 "down": p(W[pre + "mlp.down_proj"])}
            if cfg.conv_kernel:
                for conv in ("attention_conv", "mlp_conv"):
                    base = np.asarray(W[f"{pre}{conv}.base_kernel"], np.float32)
                    L[conv] = (p(W[f"{pre}{conv}.kernel_projection"]), p(base[0], "norm"), p(base[1], "norm"))
            self.layers.append(L)
        self.selector = None
        if cfg.selector_rank:
            s = "candidate_selector."
            self.selector = (p(W[s + "hidden_projection"]), p(W[s + "predecessor_codebook"], "embed"),
                             p(W[s + "successor_codebook"], "embed"))


class DFlash2Drafter(Drafter):
    name = "dflash2"
    wants_hidden = True

    def __init__(self, weights: DFlash2Weights, model, backend):
        self.w, self.cfg, self.model, self.b = weights, weights.cfg, model, backend
        self.taps = self.cfg.target_layers
        self.cache = None

    def bind(self, sched) -> None:
        if not sched.cache.ring_len:
            raise ModelError("the cache keeps no context ring for a DFlash2 drafter (plan it with the drafter)")
        self.cache = sched.cache

    # --- context: target rows into the ring ---------------------------------------------------
    def observe(self, seq, first: int, hidden) -> None:
        """Context keys and values of positions first.. into the stream's ring (the last ring_len)."""
        n, R = len(hidden), self.cache.ring_len
        if n > R:
            hidden, first, n = hidden[n - R:], first + n - R, R
        b, c = self.b, self.cfg
        ctx = b.rmsnorm(b.linear(hidden, self.w.fc), self.w.hidden_norm, c.rms_eps)
        pos = np.arange(first, first + n, dtype=np.int32)
        for i, L in enumerate(self.w.layers):
            k, v = self.keys(L, ctx, pos)
            b.ring_write(self.cache, i, seq.lane.index, k, v, pos)
        self.cache.ring_mark(seq.lane.index, pos)

    def keys(self, L: dict, x, pos: np.ndarray):
        """A layer's keys (k_norm, RoPE at `pos`) and values of rows x."""
        b, c, n = self.b, self.cfg, len(pos)
        kv = b.linear(x, L["kv"])
        width = c.kv_heads * c.head_dim
        k = b.rmsnorm(kv[:, :width].reshape(n, c.kv_heads, c.head_dim), L["k_norm"], c.rms_eps)
        return (b.rope(k, b.asarray(pos), c.rope_theta, c.head_dim),
                kv[:, width:].reshape(n, c.kv_heads, c.head_dim))

    # --- the block ------------------------------------------------------------------------------
    def propose(self, seq, k: int) -> list[int]:
        p = seq.computed
        out = self.block(seq.tokens[p], p, seq.lane.index)
        return self.choose(out, seq.tokens[p], min(k, self.cfg.block - 1))

    def block(self, anchor: int, p: int, lane: int):
        """The final-normed rows 1..B-1 of the block at positions p..p+B-1 on this lane's ring."""
        b, c, m = self.b, self.cfg, self.model
        ids = np.full(c.block, c.mask_id, np.int32)
        ids[0] = anchor
        pos = np.arange(p, p + c.block, dtype=np.int32)
        x = b.embed(m.embed, b.asarray(ids))
        if c.embed_scale != 1.0:
            x = x * np.float32(c.embed_scale)
        res = None
        for i, L in enumerate(self.w.layers):
            h, res = (b.rmsnorm(x, L["in_norm"], c.rms_eps), x) if res is None else \
                b.add_rmsnorm(x, res, L["in_norm"], c.rms_eps)
            h, after = self.conv(L, "attention_conv", h)
            a = self.attend(i, L, h, pos, lane)
            h, res = b.add_rmsnorm(self.conv(L, "attention_conv", a, after)[0], res, L["post_norm"], c.rms_eps)
            h, after = self.conv(L, "mlp_conv", h)
            gu = b.linear(h, L["gate_up"])
            half = gu.shape[1] // 2
            x = self.conv(L, "mlp_conv", b.linear(b.silu_mul(gu[:, :half], gu[:, half:]), L["down"]), after)[0]
        h, _ = b.add_rmsnorm(x, res, self.w.norm, c.rms_eps)
        return h[1:]

    def conv(self, L: dict, which: str, x, after=None):
        """v2's dynamic conv before a sublayer (returns its input and the kernels for after it), or
        after it (`after`: those kernels); x as it is without convs."""
        if which not in L:
            return x, None
        proj, base_in, base_out = L[which]
        if after is not None:
            return self.b.dynamic_conv(x, after, base_out, self.cfg.conv_group), None
        dyn = self.b.linear(x, proj)
        half = dyn.shape[1] // 2
        return self.b.dynamic_conv(x, dyn[:, :half], base_in, self.cfg.conv_group), dyn[:, half:]

    def attend(self, i: int, L: dict, h, pos: np.ndarray, lane: int):
        b, c, n = self.b, self.cfg, len(pos)
        q = b.rmsnorm(b.linear(h, L["q"]).reshape(n, c.heads, c.head_dim), L["q_norm"], c.rms_eps)
        q = b.rope(q, b.asarray(pos), c.rope_theta, c.head_dim)
        k, v = self.keys(L, h, pos)
        o = b.ring_attention(q, k, v, self.cache, i, lane, int(pos[0]), c.windows[i], c.causal)
        return b.linear(o.reshape(n, c.heads * c.head_dim), L["o"])

    # --- drafts -----------------------------------------------------------------------------------
    def choose(self, out, anchor: int, k: int) -> list[int]:
        """The greedy path of the first k block rows: the candidate selector's, or the argmax."""
        b, c = self.b, self.cfg
        rows = out[:k]
        top = c.selector_top_k if self.w.selector else 1
        values, cands = b.top_k(self.model.head(rows), top)
        if self.w.selector is None:
            return cands[:, 0].tolist()
        values = values * np.float32(c.output_multiplier)
        if c.softcap:
            values = np.tanh(values / np.float32(c.softcap)) * np.float32(c.softcap)
        proj, pred_book, succ_book = self.w.selector
        hp = b.to_host(b.linear(rows, proj))  # [k, rank]
        succ = b.to_host(b.embed(succ_book, b.asarray(cands.reshape(-1).astype(np.int32)))).reshape(k, top, -1)
        before = np.concatenate([[anchor], cands[:-1].reshape(-1)]).astype(np.int32)  # every row's predecessors
        pred = b.to_host(b.embed(pred_book, b.asarray(before)))
        path, prev = [], pred[0]
        for i in range(k):
            j = int(np.argmax(values[i] + succ[i] @ (prev * hp[i])))
            path.append(int(cands[i, j]))
            prev = pred[1 + i * top + j] if i + 1 < k else prev
        return path
