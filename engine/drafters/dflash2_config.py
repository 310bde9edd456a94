"""DFlash2 drafter checkpoints in z-lab's layout: the config, checked against the target model, and
the tensors a checkpoint of that config must ship.

config.json is a Qwen3 config (hidden_size, num_hidden_layers, heads, head_dim, intermediate_size,
rms_norm_eps, rope theta, layer_types / sliding_window, is_causal) whose drafter fields sit in
`dflash_config` (or at the top level): block_size, mask_token_id, target_layer_ids, and for v2
conv_kernel_size, conv_group_size, selector_rank, selector_top_k, output_multiplier,
final_logit_softcapping, input_embedding_scale. `synthetic:dflash2` names random weights of a
small drafter made for the target (gates, tests, the bench).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import MAX_HEAD_DIM, MAX_HEADS, MAX_VOCAB, MAX_WIDTH, Fields, ModelConfig, read_json
from ..errors import ModelError

SYNTHETIC = "synthetic:dflash2"
MAX_LAYERS, MAX_BLOCK, MAX_TAPS = 64, 64, 64
SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class DFlashConfig:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    block: int  # block rows: the last verified token, then block - 1 mask tokens (the drafts)
    mask_id: int
    target_layers: tuple[int, ...]  # the target layers whose outputs (concatenated) condition it
    windows: tuple[int | None, ...]  # per layer: its sliding window, None for the whole context
    rms_eps: float = 1e-6
    rope_theta: float = 1e6
    causal: bool = False  # block rows see each other (False) or only earlier ones
    conv_kernel: int = 0  # v2's two-tap dynamic convs (0: none, DFlash v1)
    conv_group: int = 0  # channels per group of a dynamic conv
    selector_rank: int = 0  # v2's candidate selector (0: drafts are the argmax)
    selector_top_k: int = 0
    output_multiplier: float = 1.0
    softcap: float = 0.0  # tanh softcap of the draft logits (0: none)
    embed_scale: float = 1.0  # the target's embedding of the block rows, times this
    target_depth: int = 0  # num_target_layers: the layer count of the model it was made for (0: not said)

    # --- reading ----------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, raw: Any, source: str) -> "DFlashConfig":
        if not isinstance(raw, dict):
            raise ModelError(f"{source}: a config must be a JSON object")
        top = Fields(raw, source)
        d = Fields(top.object("dflash_config"), source, "dflash_config.")

        def draft(kind: str, key: str, *args, **kw):  # dflash_config first, then the top level
            return getattr(d if d.get(key) is not None else top, kind)(key, *args, **kw)
        layers = top.int("num_hidden_layers", lo=1, hi=MAX_LAYERS)
        heads = top.int("num_attention_heads", lo=1, hi=MAX_HEADS)
        hidden = top.int("hidden_size", lo=1, hi=MAX_WIDTH)
        rope = Fields(top.object("rope_parameters") or top.object("rope_scaling"), source, "rope_parameters.")
        if rope.str("rope_type", "default") != "default":
            raise ModelError(f"{source}: rope type {rope.str('rope_type')!r} is not supported (default only)")
        if top.bool("attention_bias", False):
            raise ModelError(f"{source}: attention biases are not supported")
        window = top.int("sliding_window", 0, hi=1 << 30) or None
        types = top.strings("layer_types", layers) or [SLIDING if window and top.bool("use_sliding_window", False)
                                                        else FULL] * layers
        if len(types) != layers or any(t not in (SLIDING, FULL) for t in types):
            raise ModelError(f"{source}: layer_types must list {layers} of {SLIDING!r} / {FULL!r}")
        if SLIDING in types and window is None:
            raise ModelError(f"{source}: sliding layers need a sliding_window")
        taps = draft("array", "target_layer_ids", int)
        if not 1 <= len(taps) <= MAX_TAPS or len(set(taps)) != len(taps):
            raise ModelError(f"{source}: target_layer_ids must list 1..{MAX_TAPS} distinct target layers, got {taps}")
        causal = top.bool("is_causal", None)
        theta = top.float("rope_theta", None, hi=1e12)
        try:
            return cls(
                hidden=hidden, layers=layers, heads=heads,
                kv_heads=top.int("num_key_value_heads", 0, hi=MAX_HEADS) or heads,
                head_dim=top.int("head_dim", 0, hi=MAX_HEAD_DIM) or hidden // heads,
                intermediate=top.int("intermediate_size", lo=1, hi=MAX_WIDTH * 16),
                vocab=top.int("vocab_size", lo=1, hi=MAX_VOCAB),
                block=draft("int", "block_size", 16, lo=2, hi=MAX_BLOCK),
                mask_id=draft("int", "mask_token_id", lo=0, hi=MAX_VOCAB),
                target_layers=tuple(taps),
                windows=tuple(window if t == SLIDING else None for t in types),
                rms_eps=top.float("rms_norm_eps", 1e-6, hi=1.0),
                rope_theta=rope.float("rope_theta", 1e6, hi=1e12) if theta is None else theta,
                # z-lab's default: sliding layers attend causally unless the config says otherwise
                causal=(types[0] == SLIDING) if causal is None else causal,
                conv_kernel=draft("int", "conv_kernel_size", 0, hi=8),
                conv_group=draft("int", "conv_group_size", 0, hi=hidden),
                selector_rank=draft("int", "selector_rank", 0, hi=MAX_WIDTH),
                selector_top_k=draft("int", "selector_top_k", 0, hi=1024),
                output_multiplier=draft("float", "output_multiplier", 1.0, hi=1e6),
                softcap=draft("float", "final_logit_softcapping", 0.0, hi=1e6) if (
                    d.get("final_logit_softcapping") or top.get("final_logit_softcapping")) else 0.0,  # 0: none
                embed_scale=draft("float", "input_embedding_scale", 1.0, hi=1e6),
                target_depth=top.int("num_target_layers", 0, hi=1 << 16),
            )._checked(source)
        except ModelError as e:
            raise ModelError(f"{source}: {e}") from None

    def _checked(self, source: str) -> "DFlashConfig":
        if self.heads % self.kv_heads:
            raise ModelError(f"{self.heads} attention heads do not divide into {self.kv_heads} kv heads")
        if self.head_dim % 2:
            raise ModelError(f"head_dim must be even (RoPE pairs), got {self.head_dim}")
        if bool(self.conv_kernel) != bool(self.conv_group) or (self.conv_group and self.hidden % self.conv_group):
            raise ModelError(f"conv_group_size {self.conv_group} and conv_kernel_size {self.conv_kernel} must both be "
                             f"set, the group dividing hidden_size {self.hidden}")
        if bool(self.selector_rank) != bool(self.selector_top_k) or self.selector_top_k > self.vocab:
            raise ModelError(f"selector_rank and selector_top_k must both be set (top-k at most the vocabulary), got "
                             f"{self.selector_rank} and {self.selector_top_k}")
        if self.mask_id >= self.vocab:
            raise ModelError(f"mask_token_id {self.mask_id} is outside the vocabulary of {self.vocab}")
        return self

    @classmethod
    def from_folder(cls, path: str | Path) -> "DFlashConfig":
        folder = Path(path)
        if not folder.is_dir():
            raise ModelError(f"{folder}: not a DFlash2 checkpoint folder (config.json and *.safetensors)")
        return cls.from_hf(read_json(folder / "config.json"), str(folder / "config.json"))

    @classmethod
    def read(cls, spec: str, target: ModelConfig) -> "DFlashConfig":
        """The config `spec` names (a folder, or SYNTHETIC), checked against the target."""
        cfg = synthetic_config(target) if spec == SYNTHETIC else cls.from_folder(spec)
        cfg.check(target, spec)
        return cfg

    def check(self, target: ModelConfig, where: str) -> None:
        """ModelError unless this drafter was made for the target's shapes."""
        if self.hidden != target.hidden:
            raise ModelError(f"{where}: a DFlash2 checkpoint for hidden size {self.hidden}; the model's is "
                             f"{target.hidden}")
        if self.vocab != target.vocab:
            raise ModelError(f"{where}: a DFlash2 checkpoint for a vocabulary of {self.vocab}; the model's is "
                             f"{target.vocab}")
        if self.target_depth and self.target_depth != target.layers:
            raise ModelError(f"{where}: a DFlash2 checkpoint for a model of {self.target_depth} layers; the model has "
                             f"{target.layers}")
        bad = [t for t in self.target_layers if not 0 <= t < target.layers]
        if bad:
            raise ModelError(f"{where}: target_layer_ids {bad} are not layers of the model (0..{target.layers - 1})")

    # --- what it needs ----------------------------------------------------------------------
    def ring(self, context: int) -> tuple[int, int, int, int]:
        """(layers, positions, kv heads, head dim) of a stream's context ring: the largest window,
        or the whole context when a layer has none."""
        longest = context if None in self.windows else min(max(self.windows), context)
        return self.layers, longest, self.kv_heads, self.head_dim

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Canonical name (the stored one without `.weight`) → shape."""
        H, hd, I = self.hidden, self.head_dim, self.intermediate
        out: dict[str, tuple[int, ...]] = {"fc": (H, len(self.target_layers) * H), "hidden_norm": (H,), "norm": (H,)}
        for i in range(self.layers):
            p = f"layers.{i}."
            out.update({p + "input_layernorm": (H,), p + "post_attention_layernorm": (H,),
                        p + "self_attn.q_proj": (self.heads * hd, H), p + "self_attn.k_proj": (self.kv_heads * hd, H),
                        p + "self_attn.v_proj": (self.kv_heads * hd, H), p + "self_attn.o_proj": (H, self.heads * hd),
                        p + "self_attn.q_norm": (hd,), p + "self_attn.k_norm": (hd,),
                        p + "mlp.gate_proj": (I, H), p + "mlp.up_proj": (I, H), p + "mlp.down_proj": (H, I)})
            if self.conv_kernel:
                for conv in ("attention_conv", "mlp_conv"):
                    out[f"{p}{conv}.base_kernel"] = (2, self.conv_kernel, H)
                    out[f"{p}{conv}.kernel_projection"] = (2 * self.conv_kernel * (H // self.conv_group), H)
        if self.selector_rank:
            out["candidate_selector.hidden_projection"] = (self.selector_rank, H)
            out["candidate_selector.predecessor_codebook"] = (self.vocab, self.selector_rank)
            out["candidate_selector.successor_codebook"] = (self.vocab, self.selector_rank)
        return out

    def to_hf(self) -> dict:
        """The config.json a checkpoint of this config carries (z-lab's keys)."""
        window = next((w for w in self.windows if w), None)
        d = {"block_size": self.block, "mask_token_id": self.mask_id, "target_layer_ids": list(self.target_layers)}
        if self.conv_kernel:
            d.update(conv_kernel_size=self.conv_kernel, conv_group_size=self.conv_group)
        if self.selector_rank:
            d.update(selector_rank=self.selector_rank, selector_top_k=self.selector_top_k)
        d.update(output_multiplier=self.output_multiplier, input_embedding_scale=self.embed_scale)
        if self.softcap:
            d["final_logit_softcapping"] = self.softcap
        raw = {"architectures": ["DFlash2DraftModel" if self.conv_kernel else "DFlashDraftModel"],
               "model_type": "qwen3", "hidden_size": self.hidden, "num_hidden_layers": self.layers,
               "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
               "intermediate_size": self.intermediate, "vocab_size": self.vocab, "rms_norm_eps": self.rms_eps,
               "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta}, "attention_bias": False,
               "is_causal": self.causal, "hidden_act": "silu", "dflash_config": d,
               "num_target_layers": self.target_depth or None,
               "layer_types": [SLIDING if w else FULL for w in self.windows]}
        if window:
            raw.update(sliding_window=window, use_sliding_window=True)
        return raw


def synthetic_config(target: ModelConfig) -> DFlashConfig:
    """A v2 drafter for the target's shapes: tiny for the tiny test models, z-lab's sizes otherwise."""
    H, L = target.hidden, target.layers
    taps = tuple(sorted({1 % L, L // 2, max(0, L - 2)}))
    if H < 512:
        return DFlashConfig(hidden=H, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=2 * H,
                            vocab=target.vocab, block=8, mask_id=target.vocab - 1, target_layers=taps,
                            windows=(48, 48), conv_kernel=2, conv_group=16, selector_rank=16, selector_top_k=4,
                            output_multiplier=0.5, softcap=20.0, target_depth=L)
    heads = max(8, H // 160 // 8 * 8)
    return DFlashConfig(hidden=H, layers=5, heads=heads, kv_heads=8, head_dim=128, intermediate=3 * H,
                        vocab=target.vocab, block=8, mask_id=target.vocab - 1,
                        target_layers=tuple(sorted({round(i * (L - 3) / 4) + 1 for i in range(5)})),
                        windows=(2048,) * 5, conv_kernel=2, conv_group=16, selector_rank=256, selector_top_k=16,
                        output_multiplier=1 / math.sqrt(26), softcap=20.0, target_depth=L)

