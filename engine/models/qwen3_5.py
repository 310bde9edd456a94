"""Qwen3.5 / Qwen3.6 (dense `qwen3_5` and MoE `qwen3_5_moe`): a hybrid of Gated DeltaNet layers and
gated full-attention layers (every 4th), with a dense SwiGLU MLP or a routed MoE with a shared expert.

Full attention is Qwen3's (per-head q/k RMSNorm before RoPE; the loader has already shifted the
zero-centred norm weights to 1+w) with a partial NeoX RoPE and an output gate: q_proj yields per
head [query hd | gate hd], and o_proj reads attn ⊙ sigmoid(gate). K/V live in the paged pool.

A DeltaNet layer keeps, per lane, the last K-1 pre-conv rows and an fp32 state [Hv, Dk, Dv]; both
live in the cache's recurrent slots (`state_shapes`), never paged. A prompt chunk (one lane) runs
the chunked form on its lane's slot, decode rows the recurrent step, each row on its own lane's
slot (rows of a verify window on the lane's window slots, one launch stepping them in order): a
stream never sees another's state. The slot after the last lane is scratch: padding rows
of a captured decode batch carry lane -1, which indexes it.

MTP weights, where the checkpoint ships them, stay on the host in `self.mtp` (canonical tensors,
not prepared on the backend) until a drafter uses them.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..config import FULL
from ..kv.cache import Cache
from ..ops.base import Backend
from ..rows import Rows
from ..weights import Affine, Model, Tensor, dequantize
from .llama import fuse
from .qwen3 import Qwen3

DELTANET_CHUNK = 64  # rows per chunk of the chunked prompt form (prompt chunks are multiples of it or smaller)


def stack_expert(experts: Tensor, one: Tensor | None) -> Tensor | None:
    """Stacked experts [E, out, in] and one more [out, in] of the same format as [E + 1, out, in],
    or None where formats or shapes differ (a GGUF file's shared expert in another quant type)."""
    if not (isinstance(experts, Affine) and isinstance(one, Affine)) or experts.shape[1:] != one.shape:
        return None
    if (experts.bits, experts.group, experts.scales.dtype) != (one.bits, one.group, one.scales.dtype):
        return None

    def cat(name: str):  # np.concatenate takes device arrays too (NEP 18): landed weights stay there
        return np.concatenate([getattr(experts, name), getattr(one, name)[None]])
    return Affine(cat("packed"), cat("scales"), cat("biases"), experts.bits, experts.group)


class Qwen3_5(Qwen3):
    def __init__(self, model: Model, backend: Backend, progress: Callable[[float], None] | None = None):
        c = model.config
        self.lin_index = {layer: i for i, layer in enumerate(c.linear_layers)}
        super().__init__(model, backend, progress)
        W = model.weights
        self.mtp = None
        if c.mtp_layers and any(n.startswith("mtp.") for n in W):
            heads = ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")
            self.mtp = {name: W["mtp." + name] for name in heads}
            self.mtp["layers"] = [{n[len(pre):]: w for n, w in W.items() if n.startswith(pre)}
                                  for pre in (f"mtp.layers.{j}." for j in range(c.mtp_layers))]

    # --- weights ---------------------------------------------------------------------------
    def load_layer(self, W: dict, i: int) -> dict:
        return self.load_block(W, f"layers.{i}.", self.cfg.layer_types[i])

    def load_block(self, W: dict, pre: str, kind: str) -> dict:
        p = self.b.prepare
        layer = {"in_norm": p(W[pre + "input_layernorm"], "norm"),
                 "post_norm": p(W[pre + "post_attention_layernorm"], "norm")}
        if kind == FULL:
            layer.update(self.load_attention(W, pre + "self_attn."))
        else:
            layer.update(self.load_deltanet(W, pre + "linear_attn."))
        if self.cfg.experts:
            layer.update(self.load_moe(W, pre + "mlp."))
        else:
            layer.update(self.load_mlp(W, pre + "mlp."))
        return layer

    def load_deltanet(self, W: dict, pre: str) -> dict:
        p = self.b.prepare
        names = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
        fused = fuse([W[pre + n] for n in names])
        out = {"conv": p(W[pre + "conv1d"], "conv"), "a_log": p(W[pre + "A_log"], "norm"),
               "dt_bias": p(W[pre + "dt_bias"], "norm"), "gnorm": p(W[pre + "norm"], "norm"),
               "out": p(W[pre + "out_proj"])}
        if fused is not None:
            out["qkvzba"] = p(fused)
        else:
            out.update({n: p(W[pre + n]) for n in names})
        return out

    def load_moe(self, W: dict, pre: str) -> dict:
        p = self.b.prepare
        gate, up = W[pre + "experts.gate_proj"], W[pre + "experts.up_proj"]
        gu = fuse([gate, up])
        if gu is None:  # mixed formats: fuse dequantized (rare; keeps one op for all)
            gu = np.concatenate([dequantize(gate), dequantize(up)], axis=-2)
        down = W[pre + "experts.down_proj"]
        router = W[pre + "gate"]
        # kind "experts": stacked [E, out, in] weights (a backend may keep its own expert layout)
        if pre + "shared_expert.gate_proj" not in W:
            return {"experts_gate_up": p(gu, "experts"), "experts_down": p(down, "experts"), "router": p(router)}
        # the shared expert as routed expert E where its format is the experts' (moe_route appends it
        # under its gate): the two expert products read it, two launches fewer a layer than its own MLP
        s = pre + "shared_expert."
        sgu = stack_expert(gu, fuse([W[s + "gate_proj"], W[s + "up_proj"]]))
        sdown = stack_expert(down, W[s + "down_proj"])
        if sgu is not None and sdown is not None:
            out = {"experts_gate_up": p(sgu, "experts"), "experts_down": p(sdown, "experts"), "shared_routed": True}
        else:
            out = {"experts_gate_up": p(gu, "experts"), "experts_down": p(down, "experts"),
                   "shared": self.load_mlp(W, s)}
        # one product for [router logits | shared gate logit] where the formats agree; on the GPU a
        # row's bits are those of the router alone (the products' K segments stay: test_qwen3_5)
        both = fuse([router, W[pre + "shared_expert_gate"]])
        if both is not None:
            out["router_gate"] = p(both)
        else:
            out["router"], out["shared_gate"] = p(router), p(W[pre + "shared_expert_gate"])
        return out

    # --- recurrent state -------------------------------------------------------------------
    def state_shapes(self) -> list[tuple[tuple[int, ...], ...]]:
        """Per linear layer: conv rows [C, K-1] and the DeltaNet state [Hv, Dk, Dv], fp32."""
        c = self.cfg
        return [((c.conv_channels, c.conv_kernel - 1), (c.lin_v_heads, c.lin_k_dim, c.lin_v_dim))
                for _ in self.lin_index]

    def state_logs(self) -> list[tuple[tuple[int, ...], ...]]:
        """Per linear layer, a verify-window row's log of the DeltaNet state: k̂ [Hv, Dk], δ [Hv, Dv], e^g [Hv]."""
        c = self.cfg
        return [((c.lin_v_heads, c.lin_k_dim), (c.lin_v_heads, c.lin_v_dim), (c.lin_v_heads,)) for _ in self.lin_index]

    # --- forward ---------------------------------------------------------------------------
    def mixer(self, i: int, layer: dict, h, rows: Rows, cache: Cache):
        if i in self.lin_index:
            return self.deltanet(self.lin_index[i], layer, h, rows, cache)
        return self.attention(self.attn_index[i], layer, h, rows, cache)

    def q_width(self) -> int:
        return self.cfg.heads * self.cfg.head_dim * (2 if self.cfg.attn_output_gate else 1)

    def split_gate(self, q, n: int):
        c = self.cfg
        if not c.attn_output_gate:
            return super().split_gate(q, n)
        qg = q.reshape(n, c.heads, 2 * c.head_dim)  # per head [query | gate]
        return qg[:, :, : c.head_dim], qg[:, :, c.head_dim:].reshape(n, c.heads * c.head_dim)

    def deltanet(self, li: int, layer: dict, h, rows: Rows, cache: Cache):
        b, c, n = self.b, self.cfg, len(rows)
        Hv, Dv = c.lin_v_heads, c.lin_v_dim
        vd, C = Hv * Dv, c.conv_channels
        if "qkvzba" in layer:
            y = b.linear(h, layer["qkvzba"], rows.pad_to, rows.fp16)
            qkv, z, bb, aa = y[:, :C], y[:, C:C + vd], y[:, C + vd:C + vd + Hv], y[:, C + vd + Hv:]
        else:
            qkv, z, bb, aa = (b.linear(h, layer[nm], rows.pad_to, rows.fp16)
                              for nm in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"))
        conv, rec = cache.state[li]
        W, stride = rows.window, cache.window_stride  # verify windows: each row on its window slot
        if rows.prompt:
            x = b.conv1d_prompt(qkv, layer["conv"], conv, int(rows.lanes[0]))
            g, beta = b.deltanet_gates(aa, bb, layer["a_log"], layer["dt_bias"])
        else:
            x, g, beta = b.conv1d_step_gates(qkv, layer["conv"], conv, rows.lanes, aa, bb, layer["a_log"],
                                             layer["dt_bias"], W, stride)
        q, k, v = self.split_qkv(x)
        z = z.reshape(n, Hv, Dv)
        if rows.prompt:
            o = b.deltanet_prompt(q, k, v, g, beta, rec, int(rows.lanes[0]), DELTANET_CHUNK)
            o = b.gated_rmsnorm(o, z, layer["gnorm"], c.rms_eps)
        else:  # the recurrent step and the gated norm in one op (one launch on a GPU)
            o = b.deltanet_step_norm(q, k, v, g, beta, rec, rows.lanes, z, layer["gnorm"], c.rms_eps, W, stride,
                                     cache.logs[li])
        return b.linear(o.reshape(n, vd), layer["out"], rows.pad_to, rows.fp16, feeds_norm=True)

    def split_qkv(self, x):
        """The post-conv rows [n, C] as q, k [n, Hk, Dk] and v [n, Hv, Dv]."""
        c, n = self.cfg, len(x)
        Hk, Dk = c.lin_k_heads, c.lin_k_dim
        kd = Hk * Dk
        return (x[:, :kd].reshape(n, Hk, Dk), x[:, kd:2 * kd].reshape(n, Hk, Dk),
                x[:, 2 * kd:].reshape(n, c.lin_v_heads, c.lin_v_dim))

    def mlp(self, layer: dict, h, rows: Rows):
        if "experts_down" not in layer:
            return super().mlp(layer, h, rows)
        b, E = self.b, self.cfg.experts
        shared = gate = None
        if "router_gate" in layer:
            y = b.linear(h, layer["router_gate"], rows.pad_to, rows.fp16)
            logits, gate = y[:, :E], y[:, E:]
        else:
            logits = b.linear(h, layer["router"], rows.pad_to, rows.fp16)
            if "shared_gate" in layer:  # the shared MLP's gate, or choice E's where the expert is stacked
                gate = b.linear(h, layer["shared_gate"], rows.pad_to, rows.fp16)
        if layer.get("shared_routed"):  # expert E, one more choice of every row, its gate in the routing
            experts, weights = b.moe_route(logits, self.cfg.top_k, gate)
            return b.moe_experts(h, layer["experts_gate_up"], layer["experts_down"], experts, weights, rows.prompt)
        experts, weights = b.moe_route(logits, self.cfg.top_k)
        if "shared" in layer:  # added under its gate in the experts' combination
            shared = super().mlp(layer["shared"], h, rows)
        return b.moe_experts(h, layer["experts_gate_up"], layer["experts_down"], experts, weights, rows.prompt,
                             shared, gate)
