"""Tiny GGUF files as llama.cpp's converter and quantizer write them, from `ckpt.hf_tensors`' weights.

- `write_gguf(path, cfg, seed, qtype, embed_qtype, mix)`: llama, qwen3, qwen35 or qwen35moe (from
  `ckpt`'s HF configs), every matrix in `qtype` (or what `mix` says for its llama.cpp name), norms
  and vectors F32, the tokenizer and chat template in the metadata. Returns the float32 values a
  loader must reproduce, under HF names, in HF layout: what gguf.quants.dequantize gives for the
  stored blocks, with the converter's reordering undone.
- Blocks: the `gguf` package's own quantizers where it has one (Q4_0, Q4_1, Q5_0, Q8_0, ...); K-quants
  (which gguf.quants can only read) by the plain encoders here, in ggml's exact block layout.
- `MIX_Q4_K_M`: llama.cpp's Q4_K_M choice of types, by tensor name.
"""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

import ckpt

QT = gguf.GGMLQuantizationType
# llama.cpp's Q4_K_M: Q4_K, with Q6_K for the output head, attention values and FFN down projections
# (it picks some layers; here all of them), and the small DeltaNet gate projections in Q8_0.
MIX_Q4_K_M = {"output": "Q6_K", "attn_v": "Q6_K", "ffn_down": "Q6_K", "ffn_down_exps": "Q6_K",
              "ssm_alpha": "Q8_0", "ssm_beta": "Q8_0", "token_embd": "Q4_K"}
FILE_TYPES = {"Q4_0": "MOSTLY_Q4_0", "Q4_1": "MOSTLY_Q4_1", "Q8_0": "MOSTLY_Q8_0", "F16": "MOSTLY_F16",
              "Q4_K": "MOSTLY_Q4_K_S", "Q5_K": "MOSTLY_Q5_K_S", "Q6_K": "MOSTLY_Q6_K", "Q4_K_M": "MOSTLY_Q4_K_M"}
NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate", "linear_attn.in_proj_b": "ssm_beta",
    "linear_attn.in_proj_a": "ssm_alpha", "linear_attn.conv1d": "ssm_conv1d", "linear_attn.norm": "ssm_norm",
    "linear_attn.out_proj": "ssm_out", "linear_attn.A_log": "ssm_a", "linear_attn.dt_bias": "ssm_dt",
    "mlp.gate": "ffn_gate_inp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp", "mlp.experts.down_proj": "ffn_down_exps",
}
NEXTN = {"mtp.fc": "nextn.eh_proj", "mtp.pre_fc_norm_embedding": "nextn.enorm",
         "mtp.pre_fc_norm_hidden": "nextn.hnorm", "mtp.norm": "nextn.shared_head_norm"}


# --- K-quant blocks (ggml-common.h layouts) --------------------------------------------------------

def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)[..., None].view(np.uint8)


def _nibble_runs(q: np.ndarray, chunk: int) -> np.ndarray:
    """Codes [..., n] → bytes [..., n/2]: each run of `chunk` bytes holds 2·chunk elements, the first
    chunk in the low nibbles, the next in the high ones."""
    r = q.reshape(*q.shape[:-1], -1, 2, chunk)
    return (r[..., 0, :] | (r[..., 1, :] << 4)).reshape(*q.shape[:-1], -1).astype(np.uint8)


def _k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins → ggml's 12 bytes (get_scale_min_k4 in reverse)."""
    lo = (sc[..., :4] & 0x3F) | ((sc[..., 4:] >> 4) << 6)
    mid = (mn[..., :4] & 0x3F) | ((mn[..., 4:] >> 4) << 6)
    hi = (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4)
    return np.concatenate([lo, mid, hi], axis=-1).astype(np.uint8)


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b, 0 where b is 0 (an all-zero group)."""
    a, b = np.broadcast_arrays(a, b)
    return np.divide(a, b, out=np.zeros(a.shape, np.float32), where=b != 0)


def _k_affine(w: np.ndarray, levels: int):
    """Per 32 values: w ≈ d·sc·q − dmin·m with 6-bit sc, m and codes 0..levels."""
    b = w.reshape(w.shape[0], -1, 8, 32).astype(np.float32)
    mins = np.minimum(b.min(-1), 0.0)
    scale = (b.max(-1) - mins) / levels
    d = (scale.max(-1) / 63).astype(np.float16)
    dmin = ((-mins).max(-1) / 63).astype(np.float16)
    df, dminf = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.clip(np.rint(_ratio(scale, df[..., None])), 0, 63)
    mn = np.clip(np.rint(_ratio(-mins, dminf[..., None])), 0, 63)
    q = np.rint(_ratio(b + (dminf[..., None] * mn)[..., None], (df[..., None] * sc)[..., None]))
    q = np.clip(q, 0, levels).astype(np.uint8).reshape(w.shape[0], -1, 256)
    return d, dmin, sc.astype(np.uint8), mn.astype(np.uint8), q


def q4_k_blocks(w: np.ndarray) -> np.ndarray:
    d, dmin, sc, mn, q = _k_affine(w, 15)
    blocks = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _k_scales(sc, mn), _nibble_runs(q, 32)], axis=-1)
    return blocks.reshape(w.shape[0], -1)


def q5_k_blocks(w: np.ndarray) -> np.ndarray:
    d, dmin, sc, mn, q = _k_affine(w, 31)
    bits = (q.reshape(*q.shape[:-1], 8, 32) >> 4) & 1  # sub-block j's fifth bits go to bit j of bytes 0..31
    qh = np.bitwise_or.reduce(bits << np.arange(8, dtype=np.uint8)[:, None], axis=-2).astype(np.uint8)
    blocks = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _k_scales(sc, mn), qh, _nibble_runs(q & 0x0F, 32)],
                            axis=-1)
    return blocks.reshape(w.shape[0], -1)


def q6_k_blocks(w: np.ndarray) -> np.ndarray:
    b = w.reshape(w.shape[0], -1, 16, 16).astype(np.float32)
    amax = np.abs(b).max(-1)
    scale = amax / 31
    d = (scale.max(-1) / 127).astype(np.float16)
    df = d.astype(np.float32)
    sc = np.clip(np.rint(_ratio(scale, df[..., None])), -128, 127)
    q = np.rint(_ratio(b, (df[..., None] * sc)[..., None])) + 32
    q = np.clip(q, 0, 63).astype(np.uint8).reshape(w.shape[0], -1, 2, 128)  # two 128-value halves
    ql = _nibble_runs(q & 0x0F, 64).reshape(w.shape[0], -1, 128)
    hi = (q >> 4).reshape(*q.shape[:-1], 4, 32)  # per half: bits 2k..2k+1 of byte l are value 32k + l
    qh = np.bitwise_or.reduce(hi << (2 * np.arange(4, dtype=np.uint8))[:, None], axis=-2).reshape(w.shape[0], -1, 64)
    blocks = np.concatenate([ql, qh.astype(np.uint8), sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=-1)
    return blocks.reshape(w.shape[0], -1)


K_ENCODERS = {"Q4_K": q4_k_blocks, "Q5_K": q5_k_blocks, "Q6_K": q6_k_blocks}


def encode(value: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(stored data, float32 values gguf.quants reads back) of a [..., n] array in `kind`."""
    if kind in ("F32", "F16"):
        data = value.astype(np.float32 if kind == "F32" else np.float16)
        return data, data.astype(np.float32)
    flat = value.reshape(-1, value.shape[-1])
    data = K_ENCODERS[kind](flat) if kind in K_ENCODERS else gguf.quants.quantize(flat, QT[kind])
    deq = gguf.quants.dequantize(data, QT[kind]).reshape(value.shape)
    return data.reshape(*value.shape[:-1], -1), deq


# --- the converter's layout changes ---------------------------------------------------------------

def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's q/k row order for llama: HF rotate-half pairs → interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_cpp_permute_inverse(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tile_v_heads(w: np.ndarray, axis: int, k_heads: int, v_heads: int, dim: int, inverse: bool = False) -> np.ndarray:
    """_LinearAttentionVReorderBase: value heads grouped by key head [K0v0, K0v1, K1v0, ...] → tiled
    [K0v0, K1v0, ..., K0v1, ...] along `axis` (inverse: back)."""
    r = v_heads // k_heads
    w = np.moveaxis(w, axis, 0)
    shape = w.shape
    grouped = (k_heads, r, dim) if not inverse else (r, k_heads, dim)
    w = w.reshape(*grouped, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.moveaxis(w, 0, axis)


def _qwen35_to_gguf(name: str, t: np.ndarray, text: dict, inverse: bool = False) -> np.ndarray:
    """The converter's changes to one Qwen3.5 tensor (inverse: undo them on what was stored)."""
    hk, hv = text["linear_num_key_heads"], text["linear_num_value_heads"]
    dv, qk = text["linear_value_head_dim"], 2 * text["linear_num_key_heads"] * text["linear_key_head_dim"]
    leaf = name.removesuffix(".weight").rsplit(".", 1)[-1]
    if ".linear_attn." not in name:
        if leaf in ("input_layernorm", "post_attention_layernorm", "norm", "q_norm", "k_norm",
                    "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
            return t - np.float32(1.0) if inverse else t + np.float32(1.0)
        return t
    if leaf == "A_log" and not inverse:
        t = -np.exp(t)
    if leaf == "conv1d" and not inverse:
        t = t[:, 0, :]
    if leaf in ("in_proj_qkv", "conv1d"):
        t = np.concatenate([t[:qk], tile_v_heads(t[qk:], 0, hk, hv, dv, inverse)])
    elif leaf == "in_proj_z":
        t = tile_v_heads(t, 0, hk, hv, dv, inverse)
    elif leaf in ("in_proj_a", "in_proj_b", "dt_bias", "A_log"):
        t = tile_v_heads(t, 0, hk, hv, 1, inverse)
    if leaf == "A_log" and inverse:
        t = np.log(-t.astype(np.float64)).astype(np.float32)
    elif leaf == "out_proj":
        t = tile_v_heads(t, 1, hk, hv, dv, inverse)
    return t[:, None, :] if leaf == "conv1d" and inverse else t


def _gguf_name(name: str, layers: int) -> tuple[str, str]:
    """(llama.cpp's name without its suffix, its stem) for an HF tensor name; the MTP head is block `layers`."""
    base = name.removeprefix("model.language_model.").removeprefix("model.").removesuffix(".weight")
    if base in ("embed_tokens", "norm", "lm_head"):
        stem = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output"}[base]
        return stem, stem
    if base in NEXTN:
        return f"blk.{layers}.{NEXTN[base]}", NEXTN[base]
    offset = layers if base.startswith("mtp.") else 0
    i, rest = base.removeprefix("mtp.").removeprefix("layers.").split(".", 1)
    stem = "ffn_gate_up_exps" if rest == "mlp.experts.gate_up_proj" else NAMES[rest]
    return f"blk.{int(i) + offset}.{stem}", stem


# --- the writer ------------------------------------------------------------------------------------

def write_gguf(path: str | Path, cfg: dict, seed: int = 0, qtype: str = "Q4_1", embed_qtype: str = "Q8_0",
               pre: str = "smollm", mix: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """A GGUF as llama.cpp's converter (and llama-quantize) would write it from `write_hf(cfg, seed)`'s
    weights: matrices in `qtype`, the embedding in `embed_qtype`, `mix` overriding either by llama.cpp
    tensor stem (e.g. MIX_Q4_K_M); norms and vectors F32. Returns, under HF names and in HF layout,
    the float32 values a loader must reproduce."""
    mix = mix or {}
    text = ckpt._text(cfg)
    q5 = ckpt._is_qwen3_5(cfg)
    arch = {"llama": "llama", "qwen3": "qwen3", "qwen3_5": "qwen35", "qwen3_5_moe": "qwen35moe"}[cfg["model_type"]]
    layers = text["num_hidden_layers"]
    nh, nkv = text["num_attention_heads"], text["num_key_value_heads"]
    hd = text.get("head_dim") or text["hidden_size"] // nh
    w = gguf.GGUFWriter(str(path), arch)
    _metadata(w, arch, text, layers, hd, qtype if not mix else "Q4_K_M", pre)
    reference: dict[str, np.ndarray] = {}
    tensors = ckpt.hf_tensors(cfg, seed)
    for name, value in tensors.items():
        gname, stem = _gguf_name(name, layers)
        if stem == "ffn_gate_up_exps":  # the converter writes the fused experts as two tensors
            half = value.shape[1] // 2
            block = gname.rsplit(".", 1)[0]
            deq = [_add(w, f"{block}.{s}", part, mix.get(s, qtype))
                   for s, part in (("ffn_gate_exps", value[:, :half]), ("ffn_up_exps", value[:, half:]))]
            reference[name] = np.concatenate(deq, axis=1)
            continue
        g = _qwen35_to_gguf(name, value, text) if q5 else value
        if arch == "llama" and stem in ("attn_q", "attn_k"):
            g = llama_cpp_permute(g, nh if stem == "attn_q" else nkv)
        if g.ndim == 1 or stem in ("ssm_conv1d", "ffn_gate_inp_shexp") or g.shape[-1] % 32:
            kind = "F32"
        else:
            kind = mix.get(stem, embed_qtype if stem == "token_embd" else qtype)
        suffix = ".bias" if stem == "ssm_dt" else "" if stem == "ssm_a" else ".weight"
        deq = _add(w, gname, g, kind, suffix)
        if arch == "llama" and stem in ("attn_q", "attn_k"):
            deq = llama_cpp_permute_inverse(deq, nh if stem == "attn_q" else nkv)
        reference[name] = (_qwen35_to_gguf(name, deq, text, inverse=True) if q5 else deq).astype(np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return reference


def _add(w: gguf.GGUFWriter, gname: str, value: np.ndarray, kind: str, suffix: str = ".weight") -> np.ndarray:
    if kind in K_ENCODERS and value.shape[-1] % 256:
        raise ValueError(f"{gname}: {kind} needs rows of a multiple of 256 values, not {value.shape[-1]}")
    data, deq = encode(value, kind)
    w.add_tensor(gname + suffix, data, raw_dtype=None if kind in ("F32", "F16") else QT[kind])
    return deq


def _metadata(w: gguf.GGUFWriter, arch: str, t: dict, layers: int, hd: int, label: str, pre: str) -> None:
    nh = t["num_attention_heads"]
    mtp = t.get("mtp_num_hidden_layers", 0) if arch.startswith("qwen35") else 0
    w.add_name("Tiny " + arch)
    w.add_context_length(t["max_position_embeddings"])
    w.add_embedding_length(t["hidden_size"])
    w.add_block_count(layers + mtp)
    if t.get("intermediate_size"):
        w.add_feed_forward_length(t["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(t["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    rope = t.get("rope_parameters") or {}
    rotary = int(hd * rope.get("partial_rotary_factor", 1.0))
    w.add_rope_dimension_count(rotary)
    w.add_rope_freq_base(t.get("rope_theta") or rope["rope_theta"])
    w.add_layer_norm_rms_eps(t["rms_norm_eps"])
    w.add_vocab_size(t["vocab_size"])
    w.add_file_type(getattr(gguf.LlamaFileType, FILE_TYPES.get(label, "ALL_F32")))
    if arch.startswith("qwen35"):
        half = rotary // 2
        w.add_rope_dimension_sections([half - 2 * (half // 3), half // 3, half // 3, 0])
        w.add_ssm_conv_kernel(t["linear_conv_kernel_dim"])
        w.add_ssm_state_size(t["linear_key_head_dim"])
        w.add_ssm_group_count(t["linear_num_key_heads"])
        w.add_ssm_time_step_rank(t["linear_num_value_heads"])
        w.add_ssm_inner_size(t["linear_value_head_dim"] * t["linear_num_value_heads"])
        w.add_full_attention_interval(t.get("full_attention_interval", 4))
        if mtp:
            w.add_nextn_predict_layers(mtp)
        if t.get("num_experts"):
            w.add_expert_count(t["num_experts"])
            w.add_expert_used_count(t["num_experts_per_tok"])
            w.add_expert_feed_forward_length(t["moe_intermediate_size"])
            w.add_expert_shared_feed_forward_length(t["shared_expert_intermediate_size"])
    tk = ckpt.tiny_tokenizer()
    vocab = sorted(tk.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    tokens = [tok for tok, _ in vocab]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), t["vocab_size"])]  # llama.cpp pads to the model's vocab
    types = [3 if tok in ckpt.SPECIALS else 5 if tok.startswith("[PAD") else 1 for tok in tokens]
    merges = [" ".join(m) if isinstance(m, list) else m for m in json.loads(tk.to_str())["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(ckpt.CHAT_TEMPLATE)
