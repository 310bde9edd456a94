"""llama.cpp's tensor names and layouts → canonical names and layouts (engine.weights).

llama.cpp's converter renames every tensor (`blk.N.attn_q.weight`) and, per architecture, changes
some of them; this module undoes both:

- llama: q/k rows permuted for interleaved RoPE (undone here, so every model uses NeoX RoPE).
- qwen35 / qwen35moe: norms already shifted to 1+w (as the engine keeps them); `ssm_a` holds
  −exp(A_log); conv1d is [C, K]; the DeltaNet value heads are reordered from grouped by key head
  (HF: value head j reads key head j // r) to tiled (value head t reads key head t % Hk) in the V rows
  of `attn_qkv` and the conv, the rows of `attn_gate`, `ssm_alpha`, `ssm_beta`, `ssm_a`, `ssm_dt`,
  and the columns of `ssm_out`; the MTP head is blocks N.. with `nextn.*` tensors.
"""
from __future__ import annotations

import re

import numpy as np

from ..config import ModelConfig
from ..errors import ModelError
from ..weights import Affine, Tensor, dequantize
from . import layout

GLOBAL = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
# (llama.cpp stem, suffix) → canonical name inside a block; suffix "" is a tensor without one (ssm_a).
BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    # Gated DeltaNet
    "attn_qkv": "linear_attn.in_proj_qkv", "attn_gate": "linear_attn.in_proj_z",
    "ssm_beta": "linear_attn.in_proj_b", "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_conv1d": "linear_attn.conv1d", "ssm_norm": "linear_attn.norm", "ssm_out": "linear_attn.out_proj",
    # MoE
    "ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.gate_proj", "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj", "ffn_gate_up_exps": "mlp.experts.gate_up_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
BARE = {"ssm_a": "linear_attn.A_log", "ssm_dt": "linear_attn.dt_bias"}  # stems whose suffix is not .weight
NEXTN = {"nextn.eh_proj": "mtp.fc", "nextn.enorm": "mtp.pre_fc_norm_embedding",
         "nextn.hnorm": "mtp.pre_fc_norm_hidden", "nextn.shared_head_norm": "mtp.norm"}
# The MTP block's copies of the embedding and output head: the model's own are used.
NEXTN_COPIES = ("nextn.embed_tokens", "nextn.shared_head_head")
_NAME = re.compile(r"blk\.(\d+)\.([\w.]+?)(?:\.(weight|bias))?")


def canonical(name: str, cfg: ModelConfig) -> str | None:
    """A GGUF tensor name → canonical name; "" for a tensor the engine skips; None if unknown."""
    base, _, suffix = name.rpartition(".")
    if suffix == "weight" and base in GLOBAL:
        return GLOBAL[base]
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    block, stem, suffix = int(m[1]), m[2], m[3] or ""
    if block >= cfg.layers + cfg.mtp_layers:
        return None
    if block >= cfg.layers:  # llama.cpp keeps the MTP head as the blocks after the model's own
        if stem in NEXTN_COPIES:
            return ""
        if stem in NEXTN:
            return NEXTN[stem] if suffix == "weight" else None
        prefix = f"mtp.layers.{block - cfg.layers}."
    else:
        prefix = f"layers.{block}."
    if stem in BARE:
        return prefix + BARE[stem]
    if stem not in BLOCK or (suffix == "" and not stem.endswith("_exps")):  # fused experts may come bare
        return None
    return prefix + BLOCK[stem] + (".bias" if suffix == "bias" else "")


def unpermute_qk(w: Tensor, n_head: int) -> Tensor:
    """Undo llama.cpp's q/k row order for llama (interleaved RoPE pairs) so that every model uses NeoX.

    The converter did rows.reshape(n_head, 2, hd/2).swapaxes(1, 2); the inverse reads the stored rows
    as (n_head, hd/2, 2) and swaps back.
    """
    out = w.shape[-2] if len(w.shape) > 1 else w.shape[0]
    order = np.arange(out).reshape(n_head, out // n_head // 2, 2).swapaxes(1, 2).reshape(-1)
    return layout.rows(w, order)


def grouped(k_heads: int, v_heads: int, dim: int) -> np.ndarray:
    """Indices that turn tiled value heads (value head t at position t) back into grouped ones:
    grouped[i] = tiled[order[i]], for heads of `dim` rows each."""
    r = v_heads // k_heads
    return np.arange(v_heads * dim).reshape(r, k_heads, dim).transpose(1, 0, 2).reshape(-1)


def columns(w: Tensor, order: np.ndarray, block: int) -> Tensor:
    """Input columns of a matrix in `order`, which moves whole blocks of `block` columns. An Affine
    whose groups or words straddle those blocks is dequantized (exactly) first."""
    blocks = order.reshape(-1, block)[:, 0] // block
    if isinstance(w, Affine) and block % w.group == 0 and block * w.bits % 32 == 0:
        def take(a: np.ndarray) -> np.ndarray:
            n = a.shape[-1] // len(blocks)
            return a.reshape(*a.shape[:-1], len(blocks), n)[..., blocks, :].reshape(a.shape)
        return Affine(take(w.packed), take(w.scales), take(w.biases), w.bits, w.group)
    return np.ascontiguousarray(dequantize(w)[..., order])


def to_canonical(name: str, w: Tensor, cfg: ModelConfig, where: str) -> Tensor:
    """One tensor in llama.cpp's layout → the canonical layout (see the module's docstring)."""
    if cfg.arch == "llama" and name.removesuffix(".bias").endswith(("q_proj", "k_proj")):
        n_head = cfg.heads if ".q_proj" in name else cfg.kv_heads
        out = w.shape[-2] if len(w.shape) > 1 else w.shape[0]
        if out != n_head * cfg.head_dim or cfg.head_dim % 2:
            raise ModelError(f"{where} has {out} rows, but RoPE over {n_head} heads of {cfg.head_dim} (an even "
                             f"size) needs {n_head * cfg.head_dim}")
        return unpermute_qk(w, n_head)
    if name.endswith("mlp.shared_expert_gate") and len(w.shape) == 1:
        return w.reshape(1, -1)  # llama.cpp keeps the [1, H] gate as a vector
    if ".linear_attn." not in name:
        return w
    if name.endswith("A_log"):
        a = np.asarray(w, dtype=np.float64)
        if not (a < 0).all():
            raise ModelError(f"{where} must hold −exp(A_log) (negative numbers)")
        w = np.log(-a).astype(np.float32)
    return _ungroup(name, w, cfg, where)


def _ungroup(name: str, w: Tensor, cfg: ModelConfig, where: str) -> Tensor:
    hk, hv, dk, dv = cfg.lin_k_heads, cfg.lin_v_heads, cfg.lin_k_dim, cfg.lin_v_dim
    if hv == hk:
        return w
    leaf = name.rsplit(".", 1)[-1]
    qk = 2 * hk * dk
    if leaf in ("in_proj_qkv", "conv1d"):
        n = w.shape[-2] if len(w.shape) > 1 else w.shape[0]
        if n != qk + hv * dv:
            raise ModelError(f"{where} has {n} rows, but the config implies {qk + hv * dv}")
        return layout.rows(w, np.concatenate([np.arange(qk), qk + grouped(hk, hv, dv)]))
    per_row = {"in_proj_z": dv, "in_proj_a": 1, "in_proj_b": 1, "A_log": 1, "dt_bias": 1}
    if leaf in per_row:
        n = w.shape[-2] if len(w.shape) > 1 else w.shape[0]
        if n != hv * per_row[leaf]:
            raise ModelError(f"{where} has {n} rows, but the config implies {hv * per_row[leaf]}")
        return layout.rows(w, grouped(hk, hv, per_row[leaf]))
    if leaf == "out_proj":
        if w.shape[-1] != hv * dv:
            raise ModelError(f"{where} has {w.shape[-1]} columns, but the config implies {hv * dv}")
        return columns(w, grouped(hk, hv, dv), dv)
    return w
