"""A synthetic model (engine.synthetic) written to disk as an MLX affine-quantized folder.

For benches that must read weights from files, as a person's model is read (bench-start's time to
ready), on machines that cannot download one: config.json (HF names, the quantization block with
per-module overrides), safetensors shards of at most SHARD_BYTES with their index, and a byte-level
tokenizer.json. The weights are mlx-lm's layout: `language_model.model.*` for Qwen3.5, norms already
shifted, conv1d [C, K, 1], experts under `switch_mlp`, no MTP head.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import safetensors.numpy
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from .config import ModelConfig
from .synthetic import config_for, synthetic
from .weights import Affine

SHARD_BYTES = 4 << 30
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def stored_name(name: str, cfg: ModelConfig) -> str:
    """A canonical module name → the name mlx-lm gives it (without .weight)."""
    name = name.replace(".mlp.experts.", ".mlp.switch_mlp.")
    if name.startswith("mtp."):
        return name  # the MTP head sits beside the language model, as the HF checkpoints keep it
    if not cfg.arch.startswith("qwen3_5"):
        return name if name == "lm_head" else "model." + name
    return "language_model.lm_head" if name == "lm_head" else "language_model.model." + name


def hf_config(cfg: ModelConfig, bits: int, group: int, overrides: dict[str, dict]) -> dict:
    text = {
        "hidden_size": cfg.hidden, "num_hidden_layers": cfg.layers, "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab,
        "rms_norm_eps": cfg.rms_eps, "max_position_embeddings": cfg.max_position,
        "tie_word_embeddings": cfg.tie_embeddings, "rope_theta": cfg.rope_theta,
        "partial_rotary_factor": cfg.rotary_dim / cfg.head_dim,
    }
    if cfg.intermediate:
        text["intermediate_size"] = cfg.intermediate
    quant = {"group_size": group, "bits": bits, "mode": "affine", **overrides}
    if not cfg.arch.startswith("qwen3_5"):
        return {"model_type": cfg.arch, **text, "quantization": quant}
    text.update({"model_type": cfg.arch + "_text", "layer_types": cfg.layer_types,
                 "attn_output_gate": cfg.attn_output_gate, "linear_num_key_heads": cfg.lin_k_heads,
                 "linear_num_value_heads": cfg.lin_v_heads, "linear_key_head_dim": cfg.lin_k_dim,
                 "linear_value_head_dim": cfg.lin_v_dim, "linear_conv_kernel_dim": cfg.conv_kernel})
    if cfg.mtp_layers:
        text["mtp_num_hidden_layers"] = cfg.mtp_layers
    if cfg.experts:
        text.update({"num_experts": cfg.experts, "num_experts_per_tok": cfg.top_k,
                     "moe_intermediate_size": cfg.expert_intermediate,
                     "shared_expert_intermediate_size": cfg.shared_intermediate})
    return {"model_type": cfg.arch, "text_config": text, "tie_word_embeddings": cfg.tie_embeddings,
            "quantization": quant}


def byte_tokenizer() -> tokenizers.Tokenizer:
    """A byte-level BPE of the 256 byte symbols and no merges, with ChatML's specials (ids 256..258)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tk = tokenizers.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(SPECIALS)
    return tk


def write(folder: str | Path, name: str, seed: int = 0, bits: int = 4) -> Path:
    """`synthetic(name)` as an MLX folder in `folder` (created); returns the folder."""
    cfg, group = config_for(name)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = synthetic(name, seed, bits)
    shards: list[dict[str, np.ndarray]] = [{}]
    size, overrides = 0, {}
    for canonical, w in model.weights.items():
        stored = stored_name(canonical, cfg)
        if isinstance(w, Affine):
            if (w.bits, w.group) != (bits, group):
                overrides[stored] = {"bits": w.bits, "group_size": w.group}
            parts = {stored + ".weight": w.packed, stored + ".scales": w.scales, stored + ".biases": w.biases}
        else:
            a = w[:, :, None] if canonical.endswith("conv1d") else w  # mlx-lm's conv1d is [C, K, 1]
            parts = {stored + ".weight" if not canonical.endswith(("A_log", "dt_bias")) else stored: a}
        nbytes = sum(a.nbytes for a in parts.values())
        if size and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1].update({k: np.ascontiguousarray(v) for k, v in parts.items()})
        size += nbytes
    weight_map = {}
    for i, tensors in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        safetensors.numpy.save_file(tensors, str(folder / file), metadata={"format": "mlx"})
        weight_map.update({k: file for k in tensors})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(hf_config(cfg, bits, group, overrides), indent=1))
    byte_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "bos_token": None}))
    return folder
