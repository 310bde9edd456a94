"""Tiny random checkpoints in the real on-disk formats, for every test that needs a model.

- `write_hf(dir, cfg, seed, dtype)`: config.json, model.safetensors, tokenizer.json (a small byte-level
  BPE with ChatML specials), tokenizer_config.json, generation_config.json; Hugging Face names and
  layouts (Qwen3.5: zero-centred norms, conv1d [C, 1, K], fused experts, mtp.*).
- `write_mlx(dir, cfg, seed, bits, group, overrides)`: the same weights as mlx-lm would convert them
  (renamed, norms shifted, conv1d [C, K, 1], experts split into switch_mlp, no mtp) and affine-quantized.
- `write_gguf(path, cfg, seed, qtype)`: llama / qwen3 through gguf.GGUFWriter, Q4_1 / Q8_0 blocks
  written here, q/k rows permuted the way llama.cpp's converter does, the tokenizer in the metadata.

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
             chat_template: str | None = CHAT_TEMPLATE) -> dict[str, np.ndarray]:
    """A Hugging Face model folder; returns the stored weights as float32, by stored name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stored = _round(hf_tensors(cfg, seed), dtype)
    write_safetensors(folder / "model.safetensors", stored)
    cfg = {**cfg, "torch_dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype]}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2]}))
    write_tokenizer(folder, chat_template)
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


# --- GGUF ----------------------------------------------------------------------------------------

def q4_1_blocks(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml Q4_1 of a [rows, n] matrix: (block bytes [rows, n/32·20], dequantized float32 values).

    Block: f16 d, f16 m, 16 bytes; byte j = element j (low nibble) | element j+16 (high nibble)."""
    rows = w.shape[0]
    b = w.reshape(rows, -1, 32).astype(np.float32)
    lo, hi = b.min(-1), b.max(-1)
    d = ((hi - lo) / 15).astype(np.float16)
    m = lo.astype(np.float16)
    df, mf = d.astype(np.float32), m.astype(np.float32)
    inv = np.divide(1.0, df, out=np.zeros_like(df), where=df > 0)
    q = np.clip(np.rint((b - mf[..., None]) * inv[..., None]), 0, 15).astype(np.uint8)
    qs = q[..., :16] | (q[..., 16:] << 4)
    blocks = np.concatenate([d[..., None].view(np.uint8), m[..., None].view(np.uint8), qs], axis=-1)
    return blocks.reshape(rows, -1), (df[..., None] * q + mf[..., None]).reshape(w.shape)


def q8_0_blocks(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml Q8_0 of a [rows, n] matrix: (block bytes [rows, n/32·34], dequantized float32 values)."""
    rows = w.shape[0]
    b = w.reshape(rows, -1, 32).astype(np.float32)
    d = (np.abs(b).max(-1) / 127).astype(np.float16)
    df = d.astype(np.float32)
    inv = np.divide(1.0, df, out=np.zeros_like(df), where=df > 0)
    q = np.clip(np.rint(b * inv[..., None]), -127, 127).astype(np.int8)
    blocks = np.concatenate([d[..., None].view(np.uint8), q.view(np.uint8)], axis=-1)
    return blocks.reshape(rows, -1), (df[..., None] * q).reshape(w.shape)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's q/k row order for llama: HF rotate-half pairs → interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def write_gguf(path: str | Path, cfg: dict, seed: int = 0, qtype: str = "Q4_1", embed_qtype: str = "Q8_0",
               pre: str = "smollm") -> dict[str, np.ndarray]:
    """A llama or qwen3 GGUF, as llama.cpp's converter would write it from `write_hf(cfg, seed)`'s weights.

    Linear weights in `qtype` (Q4_1, Q8_0, F16, F32, or any other type gguf.quants can encode, for
    tests of unsupported types), the embedding in `embed_qtype`, norms F32. Returns, under HF names and
    in HF row order, the float32 values a loader must reproduce after dequantizing.
    """
    import gguf

    QT = gguf.GGMLQuantizationType
    arch = cfg["model_type"]
    t = cfg
    nh, nkv = t["num_attention_heads"], t["num_key_value_heads"]
    hd = t.get("head_dim") or t["hidden_size"] // nh
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("Tiny " + arch)
    w.add_context_length(t["max_position_embeddings"])
    w.add_embedding_length(t["hidden_size"])
    w.add_block_count(t["num_hidden_layers"])
    w.add_feed_forward_length(t["intermediate_size"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(t["rope_theta"])
    w.add_layer_norm_rms_eps(t["rms_norm_eps"])
    w.add_vocab_size(t["vocab_size"])
    w.add_file_type({"Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "F16": gguf.LlamaFileType.MOSTLY_F16}.get(qtype, gguf.LlamaFileType.ALL_F32))
    tk = tiny_tokenizer()
    vocab = sorted(tk.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    tokens = [tok for tok, _ in vocab]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), t["vocab_size"])]  # llama.cpp pads to the model's vocab
    types = [3 if tok in SPECIALS else 5 if tok.startswith("[PAD") else 1 for tok in tokens]
    merges = [" ".join(m) if isinstance(m, list) else m for m in json.loads(tk.to_str())["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    reference: dict[str, np.ndarray] = {}
    for name, value in hf_tensors(cfg, seed).items():
        base = name.removeprefix("model.").removesuffix(".weight")
        if base == "embed_tokens":
            gname, kind = "token_embd", embed_qtype
        elif base in ("norm", "lm_head"):
            gname, kind = {"norm": "output_norm", "lm_head": "output"}[base], "F32" if base == "norm" else qtype
        else:
            _, i, rest = base.split(".", 2)
            gname, kind = f"blk.{i}.{GGUF_NAMES[rest]}", "F32" if value.ndim == 1 else qtype
        if arch == "llama" and gname.endswith(("attn_q", "attn_k")):
            value = llama_cpp_permute(value, nh if gname.endswith("attn_q") else nkv)
        if kind in ("Q4_1", "Q8_0"):
            data, deq = (q4_1_blocks if kind == "Q4_1" else q8_0_blocks)(value)
        elif kind in ("F32", "F16"):
            data = value.astype(np.float32 if kind == "F32" else np.float16)
            deq = data.astype(np.float32)
        else:
            data = gguf.quants.quantize(value, QT[kind])
            deq = gguf.quants.dequantize(data, QT[kind])
        w.add_tensor(gname + ".weight", data, raw_dtype=None if kind in ("F32", "F16") else QT[kind])
        if arch == "llama" and gname.endswith(("attn_q", "attn_k")):
            deq = llama_cpp_permute_inverse(deq, nh if gname.endswith("attn_q") else nkv)
        reference[name] = deq.astype(np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return reference


def llama_cpp_permute_inverse(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
