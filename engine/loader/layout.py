"""Canonical names, the shapes each architecture needs, and the tensor edits every format shares."""
from __future__ import annotations

import re

import numpy as np

from ..config import FULL, ModelConfig
from ..errors import ModelError
from ..tokenizer import Tokenizer
from ..weights import Affine, Tensor

# Vision towers of multimodal checkpoints are not ours to run.
SKIP = ("model.visual.", "visual.", "vision_tower.", "model.vision_tower.", "language_model.vision_tower.")
# Checked in order: the first prefix that matches is replaced.
PREFIXES = (
    ("model.language_model.", ""),   # HF Qwen3.5
    ("language_model.model.", ""),   # MLX Qwen3.5
    ("language_model.lm_head", "lm_head"),
    ("model.", ""),
)
# Norms that HF Qwen3.5 stores zero-centred (y = x·(1+w)); the DeltaNet gated norm is not one of them.
ZERO_CENTRED = {"input_layernorm", "post_attention_layernorm", "norm", "q_norm", "k_norm",
                "pre_fc_norm_embedding", "pre_fc_norm_hidden"}
_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)$")


def canonical(name: str) -> str | None:
    """A checkpoint's tensor name → canonical name; `.scales`/`.biases` suffixes survive. None: skip it."""
    if name.startswith(SKIP):
        return None
    for old, new in PREFIXES:
        if name.startswith(old):
            name = new + name[len(old):]
            break
    return name.removesuffix(".weight").replace(".mlp.switch_mlp.", ".mlp.experts.")


def is_zero_centred(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in ZERO_CENTRED and not name.endswith("linear_attn.norm")


def expected(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the architecture needs, with the shape the config implies ([out, in] for linears)."""
    H, V = cfg.hidden, cfg.vocab
    need: dict[str, tuple[int, ...]] = {"embed_tokens": (V, H), "norm": (H,)}
    if not cfg.tie_embeddings:
        need["lm_head"] = (V, H)
    for i, kind in enumerate(cfg.layer_types):
        need.update(_layer(cfg, f"layers.{i}.", kind))
    if cfg.mtp_layers:
        need.update({"mtp.fc": (H, 2 * H), "mtp.pre_fc_norm_embedding": (H,),
                     "mtp.pre_fc_norm_hidden": (H,), "mtp.norm": (H,)})
        for j in range(cfg.mtp_layers):
            need.update(_layer(cfg, f"mtp.layers.{j}.", FULL))
    return need


def optional(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Tensors kept when present: attention biases (Qwen2-style checkpoints load as llama)."""
    nh, nkv, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
    outs = {"q_proj": nh * hd, "k_proj": nkv * hd, "v_proj": nkv * hd, "o_proj": cfg.hidden}
    return {f"layers.{i}.self_attn.{p}.bias": (n,) for i in cfg.attention_layers for p, n in outs.items()}


def _layer(cfg: ModelConfig, p: str, kind: str) -> dict[str, tuple[int, ...]]:
    H = cfg.hidden
    d: dict[str, tuple[int, ...]] = {p + "input_layernorm": (H,), p + "post_attention_layernorm": (H,)}
    if kind == FULL:
        nh, nkv, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        a = p + "self_attn."
        d.update({a + "q_proj": (nh * hd * (2 if cfg.attn_output_gate else 1), H), a + "k_proj": (nkv * hd, H),
                  a + "v_proj": (nkv * hd, H), a + "o_proj": (H, nh * hd)})
        if cfg.qk_norm:
            d.update({a + "q_norm": (hd,), a + "k_norm": (hd,)})
    else:
        kd, vd, hv = cfg.lin_k_heads * cfg.lin_k_dim, cfg.lin_v_heads * cfg.lin_v_dim, cfg.lin_v_heads
        a = p + "linear_attn."
        d.update({a + "in_proj_qkv": (2 * kd + vd, H), a + "in_proj_z": (vd, H), a + "in_proj_b": (hv, H),
                  a + "in_proj_a": (hv, H), a + "conv1d": (cfg.conv_channels, cfg.conv_kernel),
                  a + "A_log": (hv,), a + "dt_bias": (hv,), a + "norm": (cfg.lin_v_dim,), a + "out_proj": (H, vd)})
    m = p + "mlp."
    if cfg.experts:
        E, I, S = cfg.experts, cfg.expert_intermediate, cfg.shared_intermediate
        d.update({m + "gate": (E, H), m + "experts.gate_proj": (E, I, H), m + "experts.up_proj": (E, I, H),
                  m + "experts.down_proj": (E, H, I)})
        if S:
            d.update({m + "shared_expert.gate_proj": (S, H), m + "shared_expert.up_proj": (S, H),
                      m + "shared_expert.down_proj": (H, S), m + "shared_expert_gate": (1, H)})
    else:
        I = cfg.intermediate
        d.update({m + "gate_proj": (I, H), m + "up_proj": (I, H), m + "down_proj": (H, I)})
    return d


def rows(t: Tensor, index: slice | np.ndarray) -> Tensor:
    """Select output rows (axis -2 of a matrix, axis 0 of a vector) of a dense or quantized tensor."""
    if isinstance(t, Affine):
        return Affine(t.packed[..., index, :], t.scales[..., index, :], t.biases[..., index, :], t.bits, t.group)
    return t[index] if t.ndim == 1 else t[..., index, :]


def stack(parts: list[Tensor]) -> Tensor:
    """Per-expert tensors → one tensor with a leading expert dimension."""
    if isinstance(parts[0], Affine):
        a = parts[0]
        return Affine(np.stack([p.packed for p in parts]), np.stack([p.scales for p in parts]),
                      np.stack([p.biases for p in parts]), a.bits, a.group)
    return np.stack(parts)


def _merge_experts(weights: dict[str, Tensor], origin: dict[str, str]) -> None:
    """HF's fused gate_up_proj [E, 2I, H] → gate_proj + up_proj; per-expert tensors → one [E, ...] tensor."""
    for name in [n for n in weights if n.endswith(".mlp.experts.gate_up_proj")]:
        fused = weights.pop(name)
        half = fused.shape[-2] // 2
        base = name.removesuffix("gate_up_proj")
        weights[base + "gate_proj"] = rows(fused, slice(0, half))
        weights[base + "up_proj"] = rows(fused, slice(half, None))
        origin[base + "gate_proj"] = origin[base + "up_proj"] = origin[name]
    groups: dict[str, dict[int, str]] = {}
    for name in weights:
        if (m := _EXPERT.match(name)) is not None:
            groups.setdefault(f"{m[1]}.{m[3]}", {})[int(m[2])] = name
    for name, members in groups.items():
        if sorted(members) != list(range(len(members))):
            first = origin[members[min(members)]]
            raise ModelError(f"{first}: the experts of {name} are not numbered 0..{len(members) - 1}")
        weights[name] = stack([weights.pop(members[e]) for e in range(len(members))])
        origin[name] = origin[members[0]]


def finish(weights: dict[str, Tensor], cfg: ModelConfig, origin: dict[str, str], source: str,
           shift_norms: bool) -> list[str]:
    """The last step of every loader, in place: merge experts, drop what the architecture does not use,
    flatten conv1d to [C, K], shift zero-centred norms, then check every tensor against the config.

    `origin` maps canonical names to "file: tensor" for error messages. Returns the dropped names.
    """
    _merge_experts(weights, origin)
    if cfg.mtp_layers and not any(n.startswith("mtp.") for n in weights):
        cfg.mtp_layers = 0  # the config announces an MTP head the checkpoint does not ship
    need, maybe = expected(cfg), optional(cfg)
    dropped = [n for n in weights if n not in need and n not in maybe]
    for name in dropped:
        del weights[name]
    for name, w in weights.items():
        if name.endswith("conv1d") and isinstance(w, np.ndarray) and w.ndim == 3:
            # HF [C, 1, K], MLX [C, K, 1]: drop whichever axis is 1
            w = weights[name] = w[:, 0, :] if w.shape[1] == 1 else w[:, :, 0]
        if shift_norms and is_zero_centred(name):
            weights[name] = w + np.float32(1.0)
    for name in need:
        if name not in weights:
            raise ModelError(f"{source}: missing tensor {name} (the {cfg.arch} config needs it)")
    for name, w in weights.items():
        shape = need.get(name) or maybe[name]
        if tuple(w.shape) != shape:
            raise ModelError(f"{origin[name]}: shape {list(w.shape)}, but the config implies {list(shape)}")
    for i in cfg.attention_layers:
        # q, k and v are one fused projection: their biases come as a set or not at all
        qkv = [f"layers.{i}.self_attn.{p}.bias" for p in ("q_proj", "k_proj", "v_proj")]
        present = [n for n in qkv if n in weights]
        if present and len(present) != 3:
            missing = ", ".join(n for n in qkv if n not in weights)
            raise ModelError(f"{origin[present[0]]}: an attention bias without the others ({missing} missing)")
    return dropped


def check_tokenizer(tok: Tokenizer, cfg: ModelConfig, source: str) -> None:
    """Every id the tokenizer can produce, and every stop id, must be a row of the embedding."""
    if tok.max_id >= cfg.vocab:
        raise ModelError(f"{source}: the tokenizer has token id {tok.max_id} but the model's vocabulary is {cfg.vocab}")
    bad = sorted(i for i in tok.eos_ids if not 0 <= i < cfg.vocab)
    if bad:
        raise ModelError(f"{source}: end-of-sequence id {bad[0]} is outside the model's vocabulary "
                         f"(0..{cfg.vocab - 1})")
