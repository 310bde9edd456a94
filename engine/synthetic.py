"""Random models of real shapes, in the real affine-quantized format, built in memory (no files).

For the bench (`--synthetic NAME`), the gates on shapes we cannot download, and tests.
"""
from __future__ import annotations

import codecs

import numpy as np

from .config import FULL, LINEAR, ModelConfig
from .errors import ContextLengthError, ModelError
from .tokenizer import clean_text
from .weights import Affine, Model, quantize

SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(arch="llama", hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, intermediate=1536,
                         vocab=49152, rope_theta=100000.0, rms_eps=1e-5, tie_embeddings=True, max_position=8192,
                         group=32),
    "llama3-8b": dict(arch="llama", hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
                      vocab=128256, rope_theta=500000.0, rms_eps=1e-5, max_position=131072, group=64),
    "qwen3.5-27b": dict(arch="qwen3_5", hidden=5120, layers=64, heads=24, kv_heads=4, head_dim=256,
                        intermediate=17408, vocab=248320, rope_theta=1e7, rotary_dim=64, max_position=262144,
                        qk_norm=True, attn_output_gate=True, lin_k_heads=16, lin_v_heads=48, lin_k_dim=128,
                        lin_v_dim=128, conv_kernel=4, mtp_layers=1, group=64),
    "qwen3.6-35b-a3b": dict(arch="qwen3_5_moe", hidden=2048, layers=40, heads=16, kv_heads=2, head_dim=256,
                            vocab=248320, rope_theta=1e7, rotary_dim=64, max_position=262144, qk_norm=True,
                            attn_output_gate=True, lin_k_heads=16, lin_v_heads=32, lin_k_dim=128, lin_v_dim=128,
                            conv_kernel=4, experts=256, top_k=8, expert_intermediate=512, shared_intermediate=512,
                            mtp_layers=1, group=64),
    # Tiny shapes for tests: every code path, milliseconds per step.
    "tiny-llama": dict(arch="llama", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=96,
                       vocab=272, rope_theta=10000.0, max_position=4096, group=32),
    "tiny-qwen3": dict(arch="qwen3", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=96,
                       vocab=272, rope_theta=1e6, max_position=4096, qk_norm=True, group=32),
    # Both layer kinds twice (LLLF LLLF), GQA in attention (4/2) and in DeltaNet (4 value heads on 2 key heads).
    "tiny-qwen3.5": dict(arch="qwen3_5", hidden=64, layers=8, heads=4, kv_heads=2, head_dim=16, intermediate=96,
                         vocab=272, rope_theta=1e7, rotary_dim=4, max_position=4096, qk_norm=True,
                         attn_output_gate=True, lin_k_heads=2, lin_v_heads=4, lin_k_dim=16, lin_v_dim=16,
                         conv_kernel=4, mtp_layers=1, group=32),
    "tiny-qwen3.5-moe": dict(arch="qwen3_5_moe", hidden=64, layers=8, heads=4, kv_heads=2, head_dim=16,
                             vocab=272, rope_theta=1e7, rotary_dim=4, max_position=4096, qk_norm=True,
                             attn_output_gate=True, lin_k_heads=2, lin_v_heads=4, lin_k_dim=16, lin_v_dim=16,
                             conv_kernel=4, experts=8, top_k=2, expert_intermediate=32, shared_intermediate=32,
                             mtp_layers=1, group=32),
}


def config_for(name: str) -> tuple[ModelConfig, int]:
    if name not in SHAPES:
        raise ModelError(f"unknown synthetic model {name!r} (known: {', '.join(SHAPES)})")
    kw = dict(SHAPES[name])
    group = kw.pop("group")
    if kw["arch"].startswith("qwen3_5"):
        kw["layer_types"] = [FULL if (i + 1) % 4 == 0 else LINEAR for i in range(kw["layers"])]
    return ModelConfig(**kw), group


class ByteTokenizer:
    """UTF-8 bytes as token ids 16..271, specials below, and every id above reads as one letter (so
    a random model of a real vocabulary still writes text): enough to drive a random model."""

    def __init__(self, vocab: int):
        self.bos_id, self.eos_ids, self.vocab_size = 1, {2}, vocab
        self.max_token_chars = 1  # a character is one to four byte tokens
        self.thinks = False

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        return [16 + b for b in clean_text(text).encode()]

    def decode(self, ids: list[int]) -> str:
        stream = self.stream()
        return "".join(stream.push(i) for i in ids) + stream.flush()

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def encode_chat(self, messages: list[dict], limit: int | None = None, **extra) -> list[int]:
        return self.chat_prompt(messages, limit=limit)[1]

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True, limit: int | None = None,
                    **extra) -> tuple[str, list[int]]:
        text = self.render_chat(messages, add_generation_prompt)
        if limit is not None and len(text) > limit:
            raise ContextLengthError(f"the conversation ({len(text)} characters) does not fit the context of "
                                     f"{limit} tokens")
        return text, [self.bos_id] + self.encode(text)

    def stream(self):
        return _ByteStream(self)


class _ByteStream:
    """Incremental UTF-8: holds an incomplete character back, replaces invalid bytes."""

    def __init__(self, tok: ByteTokenizer):
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        if token < 16:
            return ""
        if token < 272:
            return self.dec.decode(bytes([token - 16]))
        return self.dec.decode(b"", final=True) + chr(97 + (token - 272) % 26)

    def flush(self) -> str:
        return self.dec.decode(b"", final=True)


def _random_affine(rng: np.random.Generator, shape: tuple[int, ...], bits: int, group: int, std: float) -> Affine:
    *lead, out, n = shape
    packed = rng.integers(0, 1 << 32, size=(*lead, out, n * bits // 32), dtype=np.uint32)
    levels = (1 << bits) - 1
    scales = np.full((*lead, out, n // group), 2 * std * 1.7 / levels, np.float16)
    scales *= rng.uniform(0.5, 1.5, scales.shape).astype(np.float16)
    biases = (-scales.astype(np.float32) * levels / 2).astype(np.float16)
    return Affine(packed, scales, biases, bits, group)


def weight_shapes(c: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """Canonical name → (shape, kind) with kind 'linear', 'norm', 'gnorm', 'conv', 'alog', 'bias' or 'router'."""
    H, out = c.hidden, {}
    out["embed_tokens"] = ((c.vocab, H), "linear")
    out["norm"] = ((H,), "norm")
    if not c.tie_embeddings:
        out["lm_head"] = ((c.vocab, H), "linear")
    for i, kind in enumerate(c.layer_types):
        _block(c, f"layers.{i}.", kind, out)
    if c.mtp_layers:  # the MTP head: fc over [embedding | hidden], its norms, one full-attention layer
        out["mtp.fc"] = ((H, 2 * H), "linear")
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            out["mtp." + n] = ((H,), "norm")
        for j in range(c.mtp_layers):
            _block(c, f"mtp.layers.{j}.", FULL, out)
    return out


def _block(c: ModelConfig, p: str, kind: str, out: dict) -> None:
    """The weights of one decoder layer named p + ... (attention or DeltaNet, then MLP or MoE)."""
    H = c.hidden
    out[p + "input_layernorm"] = ((H,), "norm")
    out[p + "post_attention_layernorm"] = ((H,), "norm")
    if kind == FULL:
        a = p + "self_attn."
        qw = c.heads * c.head_dim * (2 if c.attn_output_gate else 1)
        out[a + "q_proj"] = ((qw, H), "linear")
        out[a + "k_proj"] = ((c.kv_heads * c.head_dim, H), "linear")
        out[a + "v_proj"] = ((c.kv_heads * c.head_dim, H), "linear")
        out[a + "o_proj"] = ((H, c.heads * c.head_dim), "linear")
        if c.qk_norm:
            out[a + "q_norm"] = ((c.head_dim,), "norm")
            out[a + "k_norm"] = ((c.head_dim,), "norm")
    else:
        a = p + "linear_attn."
        vd = c.lin_v_heads * c.lin_v_dim
        out[a + "in_proj_qkv"] = ((c.conv_channels, H), "linear")
        out[a + "in_proj_z"] = ((vd, H), "linear")
        out[a + "in_proj_b"] = ((c.lin_v_heads, H), "linear")
        out[a + "in_proj_a"] = ((c.lin_v_heads, H), "linear")
        out[a + "out_proj"] = ((H, vd), "linear")
        out[a + "conv1d"] = ((c.conv_channels, c.conv_kernel), "conv")
        out[a + "A_log"] = ((c.lin_v_heads,), "alog")
        out[a + "dt_bias"] = ((c.lin_v_heads,), "bias")
        out[a + "norm"] = ((c.lin_v_dim,), "gnorm")
    m = p + "mlp."
    if c.experts:
        E, I, S = c.experts, c.expert_intermediate, c.shared_intermediate
        out[m + "gate"] = ((E, H), "router")
        out[m + "experts.gate_proj"] = ((E, I, H), "linear")
        out[m + "experts.up_proj"] = ((E, I, H), "linear")
        out[m + "experts.down_proj"] = ((E, H, I), "linear")
        out[m + "shared_expert.gate_proj"] = ((S, H), "linear")
        out[m + "shared_expert.up_proj"] = ((S, H), "linear")
        out[m + "shared_expert.down_proj"] = ((H, S), "linear")
        out[m + "shared_expert_gate"] = ((1, H), "router")
    else:
        out[m + "gate_proj"] = ((c.intermediate, H), "linear")
        out[m + "up_proj"] = ((c.intermediate, H), "linear")
        out[m + "down_proj"] = ((H, c.intermediate), "linear")


def synthetic(name: str, seed: int = 0, bits: int = 4, make_affine=None) -> Model:
    """A random model of `name`'s shapes: linear weights affine `bits`-bit (routers 8-bit).

    `make_affine(index, shape, bits, group, std)` builds the quantized tensors (the bench passes one
    that fills GPU memory directly); the default draws them on the host.
    """
    cfg, group = config_for(name)
    rng = np.random.default_rng(seed)
    if make_affine is None:
        def make_affine(i, shape, b, g, std):
            return _random_affine(rng, shape, b, g, std)
    weights = {}
    for i, (wname, (shape, kind)) in enumerate(weight_shapes(cfg).items()):
        if kind in ("linear", "router"):
            b = 8 if kind == "router" else bits
            g = group if shape[-1] % group == 0 else 32
            weights[wname] = make_affine(i, shape, b, g, shape[-1] ** -0.5)
        elif kind == "norm" or kind == "gnorm":
            weights[wname] = rng.uniform(0.8, 1.2, shape).astype(np.float32)
        elif kind == "conv":
            weights[wname] = rng.normal(0, 0.3, shape).astype(np.float32)
        elif kind == "alog":
            weights[wname] = np.log(rng.uniform(1, 16, shape)).astype(np.float32)
        else:
            weights[wname] = rng.normal(0, 0.5, shape).astype(np.float32)
    return Model(cfg, weights, ByteTokenizer(cfg.vocab), name, f"synthetic:{name}", "synthetic",
                 meta={"bits": bits, "group": group})


def dense_quantized(name: str, seed: int = 0, bits: int = 4) -> Model:
    """Like `synthetic` but quantized from Gaussian weights (smoother logits: tests, gates)."""
    cfg, group = config_for(name)
    rng = np.random.default_rng(seed)
    m = synthetic(name, seed, bits)
    for wname, (shape, kind) in weight_shapes(cfg).items():
        if kind == "linear":
            m.weights[wname] = quantize(rng.normal(0, shape[-1] ** -0.5, shape) * (4 if wname == "embed_tokens" else 1),
                                        bits, group)
    return m
