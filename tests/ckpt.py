"""Tiny random checkpoints in the real on-disk formats, for every test that needs a model.

- `write_hf(dir, cfg, seed, dtype)`: config.json, model.safetensors, tokenizer.json (a small byte-level
  BPE with ChatML specials), tokenizer_config.json, generation_config.json; Hugging Face names and
  layouts (Qwen3.5: zero-centred norms, conv1d [C, 1, K], fused experts, mtp.*).
- `write_mlx(dir, cfg, seed, bits, group, overrides)`: the same weights as mlx-lm would convert them
  (renamed, norms shifted, conv1d [C, K, 1], experts split into switch_mlp, no mtp) and affine-quantized.
- GGUF files: `ckpt_gguf.write_gguf` (llama, qwen3, qwen35, qwen35moe as llama.cpp converts them).
- `write_dflash2(dir, target, seed, dtype, cfg)`: a DFlash2 drafter checkpoint in z-lab's layout (its
  config.json with `dflash_config`, model.safetensors under z-lab's names) for the target's shapes.

Each writer is deterministic in `seed` and returns the float32 weights it stored, under their stored
names, so tests can compare what a loader returns with what was written. The configs are plain HF
config dicts: `tiny_llama_config()`, `tiny_qwen3_config()`, `tiny_qwen3_5_config()`,
`tiny_qwen3_5_moe_config()`.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# SmolLM2's own template, so chat rendering is tested against a real-world template.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen3.5's rules in small: the generation prompt opens <think> (or an empty block when thinking is
# off), and an earlier reply keeps its reasoning_content only after the last user message.
THINK_TEMPLATE = (
    "{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\n' }}"
    "{%- if m.role == 'assistant' and m.reasoning_content is string and m.reasoning_content"
    " and loop.index0 > ns.last %}"
    "{{- '<think>\n' + m.reasoning_content + '\n</think>\n\n' }}{%- endif %}"
    "{{- m.content + '<|im_end|>\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}"
    "{%- else %}{{- '<think>\n' }}{%- endif %}{%- endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Hello world! Hello there, how are you today?\n",
    "def main():\n    print('hello')\n    return 0\n",
    "In 2024 there were 365 days; numbers like 3.14159 and 1,000 appear often.",
    "the cat sat on the mat with the hat and the bat.",
    "Ünïcödé café naïve résumé — 日本語 😀",
]
TOKENIZER_VOCAB = 300
DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "U32": np.uint32, "I32": np.int32}
ST_NAMES = {np.dtype(v): k for k, v in DTYPES.items()}
_DTYPE_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}  # config.json's words


# --- configs -------------------------------------------------------------------------------------

def tiny_llama_config() -> dict:
    """SmolLM2-shaped (tied embeddings, GQA) but tiny."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 320, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "max_position_embeddings": 512, "tie_word_embeddings": True, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2,
    }


def tiny_qwen3_config() -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 320, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "max_position_embeddings": 512, "tie_word_embeddings": False, "hidden_act": "silu",
        "attention_bias": False, "use_sliding_window": False, "bos_token_id": 1, "eos_token_id": 2,
    }


def _qwen3_5_text(moe: bool) -> dict:
    text = {
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text", "hidden_size": 64,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "vocab_size": 320, "rms_norm_eps": 1e-6, "max_position_embeddings": 512, "tie_word_embeddings": False,
        "hidden_act": "silu", "attention_bias": False, "attn_output_gate": True,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
        "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        "mtp_num_hidden_layers": 1, "bos_token_id": 1, "eos_token_id": 2,
    }
    if moe:
        text.update({"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                     "shared_expert_intermediate_size": 32})
    else:
        text["intermediate_size"] = 128
    return text


def tiny_qwen3_5_config() -> dict:
    """Qwen3.5 layout: nested text_config, 3 Gated DeltaNet layers then one gated full-attention layer."""
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "text_config": _qwen3_5_text(moe=False), "vision_config": {"model_type": "qwen3_5_vision"},
            "tie_word_embeddings": False}


def tiny_qwen3_5_moe_config() -> dict:
    """Qwen3.5-MoE layout: as tiny_qwen3_5_config with 8 experts (top 2) and a shared expert."""
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
            "text_config": _qwen3_5_text(moe=True), "vision_config": {"model_type": "qwen3_5_moe_vision"},
            "tie_word_embeddings": False}


def tiny_gguf_config(arch: str) -> dict:
    """A tiny config of `arch` ("llama", "qwen3", "qwen3_5", "qwen3_5_moe") whose every matrix has an
    input width that K-quants (blocks of 256) can store; Qwen3.5 with twice as many value heads as
    key heads, so llama.cpp's value-head order differs from HF's."""
    wide = {"hidden_size": 256, "head_dim": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
    if arch in ("llama", "qwen3"):
        cfg = tiny_llama_config() if arch == "llama" else tiny_qwen3_config()
        return {**cfg, **wide, "intermediate_size": 512, "num_hidden_layers": 2}
    cfg = tiny_qwen3_5_moe_config() if arch == "qwen3_5_moe" else tiny_qwen3_5_config()
    text = {**cfg["text_config"], **wide, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
            "linear_num_key_heads": 4, "linear_num_value_heads": 8}
    if arch == "qwen3_5_moe":
        text.update({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
                     "shared_expert_intermediate_size": 256})
    else:
        text["intermediate_size"] = 512
    return {**cfg, "text_config": text}


# --- tokenizer -----------------------------------------------------------------------------------

def tiny_tokenizer() -> tokenizers.Tokenizer:
    """A byte-level BPE trained on a fixed corpus, with SmolLM2's pre-tokenizer and ChatML specials."""
    tk = tokenizers.Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(CORPUS, trainer)
    return tk


def write_tokenizer(folder: Path, chat_template: str | None = CHAT_TEMPLATE) -> tokenizers.Tokenizer:
    tk = tiny_tokenizer()
    tk.save(str(folder / "tokenizer.json"))
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
          "pad_token": "<|im_end|>", "unk_token": None, "add_bos_token": False, "clean_up_tokenization_spaces": False,
          "model_max_length": 512}
    if chat_template is not None:
        tc["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    return tk


# --- safetensors ---------------------------------------------------------------------------------

def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict | None = None) -> None:
    """The safetensors format byte for byte (header JSON padded to 8 bytes, data in header order)."""
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, t in tensors.items():
        header[name] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for t in tensors.values():
            f.write(np.ascontiguousarray(t).tobytes())


# --- random weights in Hugging Face names and layouts --------------------------------------------

def _text(cfg: dict) -> dict:
    return cfg.get("text_config") or cfg


def _is_qwen3_5(cfg: dict) -> bool:
    return cfg["model_type"].startswith("qwen3_5")


def hf_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """float32 weights with the names, shapes and conventions of a transformers checkpoint."""
    rng = np.random.default_rng(seed)
    t = _text(cfg)
    H, V = t["hidden_size"], t["vocab_size"]
    nh, nkv = t["num_attention_heads"], t["num_key_value_heads"]
    hd = t.get("head_dim") or H // nh
    q5 = _is_qwen3_5(cfg)
    pre = "model.language_model." if q5 else "model."
    out: dict[str, np.ndarray] = {}

    def linear(name: str, n_out: int, n_in: int, lead: tuple[int, ...] = ()) -> None:
        out[name] = (rng.standard_normal((*lead, n_out, n_in)) / math.sqrt(n_in)).astype(np.float32)

    def norm(name: str, n: int, zero_centred: bool = False) -> None:
        # Qwen3.5 stores (1+w) norms as w: small values around 0 instead of around 1
        out[name] = ((0.0 if zero_centred else 1.0) + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def decoder_layer(p: str, kind: str) -> None:
        norm(p + "input_layernorm.weight", H, q5)
        norm(p + "post_attention_layernorm.weight", H, q5)
        if kind == "full_attention":
            a = p + "self_attn."
            linear(a + "q_proj.weight", nh * hd * (2 if q5 else 1), H)
            linear(a + "k_proj.weight", nkv * hd, H)
            linear(a + "v_proj.weight", nkv * hd, H)
            linear(a + "o_proj.weight", H, nh * hd)
            if cfg["model_type"] != "llama":
                norm(a + "q_norm.weight", hd, q5)
                norm(a + "k_norm.weight", hd, q5)
        else:
            a = p + "linear_attn."
            hk, hv = t["linear_num_key_heads"], t["linear_num_value_heads"]
            kd, vd = hk * t["linear_key_head_dim"], hv * t["linear_value_head_dim"]
            linear(a + "in_proj_qkv.weight", 2 * kd + vd, H)
            linear(a + "in_proj_z.weight", vd, H)
            linear(a + "in_proj_b.weight", hv, H)
            linear(a + "in_proj_a.weight", hv, H)
            k = t["linear_conv_kernel_dim"]
            out[a + "conv1d.weight"] = (rng.standard_normal((2 * kd + vd, 1, k)) / math.sqrt(k)).astype(np.float32)
            out[a + "A_log"] = np.log(rng.uniform(1.0, 16.0, hv)).astype(np.float32)
            out[a + "dt_bias"] = (1.0 + 0.1 * rng.standard_normal(hv)).astype(np.float32)
            norm(a + "norm.weight", t["linear_value_head_dim"])  # the gated norm is never zero-centred
            linear(a + "out_proj.weight", H, vd)
        m = p + "mlp."
        if t.get("num_experts"):
            E, I, S = t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
            linear(m + "gate.weight", E, H)
            linear(m + "experts.gate_up_proj", 2 * I, H, (E,))  # fused, no .weight, as transformers stores it
            linear(m + "experts.down_proj", H, I, (E,))
            linear(m + "shared_expert.gate_proj.weight", S, H)
            linear(m + "shared_expert.up_proj.weight", S, H)
            linear(m + "shared_expert.down_proj.weight", H, S)
            linear(m + "shared_expert_gate.weight", 1, H)
        else:
            I = t["intermediate_size"]
            linear(m + "gate_proj.weight", I, H)
            linear(m + "up_proj.weight", I, H)
            linear(m + "down_proj.weight", H, I)

    out[pre + "embed_tokens.weight"] = (0.5 * rng.standard_normal((V, H))).astype(np.float32)
    types = t.get("layer_types") or ["full_attention"] * t["num_hidden_layers"]
    for i, kind in enumerate(types):
        decoder_layer(f"{pre}layers.{i}.", kind)
    norm(pre + "norm.weight", H, q5)
    if not cfg.get("tie_word_embeddings", t.get("tie_word_embeddings", False)):
        linear("lm_head.weight", V, H)
    for j in range(t.get("mtp_num_hidden_layers", 0) if q5 else 0):
        decoder_layer(f"mtp.layers.{j}.", "full_attention")
    if q5 and t.get("mtp_num_hidden_layers"):
        linear("mtp.fc.weight", H, 2 * H)
        for n in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"):
            norm(n, H, True)
    return out


def _round(tensors: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """Stored arrays in `dtype` ('f32', 'f16' or 'bf16'); keep returning float32 views of what was stored."""
    np_dtype = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]
    return {n: t.astype(np_dtype) for n, t in tensors.items()}


def write_hf(folder: str | Path, cfg: dict, seed: int = 0, dtype: str = "bf16",
             chat_template: str | None = CHAT_TEMPLATE, tensors: dict[str, np.ndarray] | None = None
             ) -> dict[str, np.ndarray]:
    """A Hugging Face model folder (of `tensors` under HF names, else random weights from `seed`);
    returns the stored weights as float32, by stored name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stored = _round(hf_tensors(cfg, seed) if tensors is None else tensors, dtype)
    write_safetensors(folder / "model.safetensors", stored)
    cfg = {**cfg, "torch_dtype": _DTYPE_NAMES[dtype]}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2]}))
    write_tokenizer(folder, chat_template)
    return {n: t.astype(np.float32) for n, t in stored.items()}


# --- DFlash2 drafters ------------------------------------------------------------------------------

def write_dflash2(folder: str | Path, target, seed: int = 0, dtype: str = "bf16", cfg=None,
                  tensors: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """A DFlash2 checkpoint folder for `target` (a ModelConfig): `cfg` (default: the synthetic
    drafter of its shapes) and `tensors` (canonical names; default: random from `seed`). Returns the
    stored weights as float32, by canonical name."""
    from engine.drafters.dflash2_config import synthetic_config
    from engine.drafters.dflash2_weights import random_tensors, stored_name

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = cfg or synthetic_config(target)
    stored = _round(random_tensors(cfg, seed) if tensors is None else tensors, dtype)
    write_safetensors(folder / "model.safetensors", {stored_name(n): t for n, t in stored.items()})
    (folder / "config.json").write_text(json.dumps({**cfg.to_hf(), "dtype": _DTYPE_NAMES[dtype]}, indent=2))
    return {n: t.astype(np.float32) for n, t in stored.items()}


# --- MLX -----------------------------------------------------------------------------------------

def mlx_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """hf_tensors as mlx-lm's convert leaves them (before quantization), float32."""
    out: dict[str, np.ndarray] = {}
    q5 = _is_qwen3_5(cfg)
    for name, t in hf_tensors(cfg, seed).items():
        if name.startswith("mtp."):
            continue  # mlx-lm drops the MTP head
        if q5:
            name = name.replace("model.language_model.", "language_model.model.")
            name = "language_model.lm_head.weight" if name == "lm_head.weight" else name
            leaf = name.removesuffix(".weight").rsplit(".", 1)[-1]
            if leaf in ("input_layernorm", "post_attention_layernorm", "norm", "q_norm", "k_norm") \
                    and ".linear_attn." not in name:
                t = t + np.float32(1.0)
            if name.endswith("conv1d.weight"):
                t = np.ascontiguousarray(t.transpose(0, 2, 1))
        if name.endswith("experts.gate_up_proj"):
            base = name.replace("experts.gate_up_proj", "switch_mlp.")
            half = t.shape[1] // 2
            out[base + "gate_proj.weight"], out[base + "up_proj.weight"] = t[:, :half], t[:, half:]
            continue
        if name.endswith("experts.down_proj"):
            name = name.replace("experts.down_proj", "switch_mlp.down_proj.weight")
        out[name] = t
    return out


def write_mlx(folder: str | Path, cfg: dict, seed: int = 0, bits: int = 4, group: int = 32,
              overrides: dict[str, dict] | None = None) -> dict[str, np.ndarray]:
    """An MLX affine-quantized folder. Linear and embedding weights whose input dim divides by their
    group are quantized (bf16 scales/biases); `overrides` maps an MLX module path to its own
    {"bits", "group_size"}. Returns every weight as float32 (quantized ones dequantized), by stored name."""
    from engine.weights import dequantize, quantize

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    overrides = overrides or {}
    stored: dict[str, np.ndarray] = {}
    values: dict[str, np.ndarray] = {}
    for name, t in mlx_tensors(cfg, seed).items():
        module = name.removesuffix(".weight")
        o = overrides.get(module, {})
        b, g = o.get("bits", bits), o.get("group_size", group)
        if name.endswith(".weight") and t.ndim >= 2 and "conv1d" not in name and t.shape[-1] % g == 0:
            a = quantize(t, b, g, scale_dtype=ml_dtypes.bfloat16)
            stored[name], stored[module + ".scales"], stored[module + ".biases"] = a.packed, a.scales, a.biases
            values[name] = dequantize(a)
        else:
            stored[name] = t.astype(ml_dtypes.bfloat16)
            values[name] = stored[name].astype(np.float32)
    write_safetensors(folder / "model.safetensors", stored, {"format": "mlx"})
    quant = {"group_size": group, "bits": bits, "mode": "affine", **overrides}
    # mlx-lm writes the block under both keys
    (folder / "config.json").write_text(json.dumps({**cfg, "quantization": quant, "quantization_config": quant}))
    write_tokenizer(folder)
    return values
