"""ModelConfig: the shapes of one model, read from a Hugging Face config.json or GGUF metadata."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ModelError

ARCHES = ("llama", "qwen3", "qwen3_5", "qwen3_5_moe")
FULL, LINEAR = "full_attention", "linear_attention"


@dataclass
class ModelConfig:
    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int = 0
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    rotary_dim: int = 0  # 0: the whole head_dim
    max_position: int = 32768
    tie_embeddings: bool = False
    qk_norm: bool = False
    attn_output_gate: bool = False
    layer_types: list[str] = field(default_factory=list)
    # Gated DeltaNet (qwen3_5)
    lin_k_heads: int = 0
    lin_v_heads: int = 0
    lin_k_dim: int = 0
    lin_v_dim: int = 0
    conv_kernel: int = 4
    # MoE (qwen3_5_moe)
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHES:
            raise ModelError(f"unknown architecture {self.arch!r} (supported: {', '.join(ARCHES)})")
        if not self.rotary_dim:
            self.rotary_dim = self.head_dim
        if not self.layer_types:
            self.layer_types = [FULL] * self.layers
        if len(self.layer_types) != self.layers:
            raise ModelError(f"layer_types has {len(self.layer_types)} entries for {self.layers} layers")
        for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "vocab"):
            if getattr(self, name) <= 0:
                raise ModelError(f"config field {name} must be positive, got {getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise ModelError(f"{self.heads} attention heads do not divide into {self.kv_heads} kv heads")
        if self.lin_k_heads and self.lin_v_heads % self.lin_k_heads:
            raise ModelError(f"{self.lin_v_heads} linear value heads do not divide into {self.lin_k_heads} key heads")

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == FULL]

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == LINEAR]

    @property
    def conv_channels(self) -> int:
        return 2 * self.lin_k_heads * self.lin_k_dim + self.lin_v_heads * self.lin_v_dim

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        """K and V of every attention layer for one token; fp8 adds one fp32 scale per head and row."""
        per_head = self.head_dim * 2 if kv_dtype == "bf16" else self.head_dim + 4
        return len(self.attention_layers) * 2 * self.kv_heads * per_head

    def state_bytes_per_stream(self) -> int:
        """DeltaNet conv rows (fp32) and recurrent state (fp32) that one stream keeps, never paged."""
        n = len(self.linear_layers)
        conv = self.conv_channels * (self.conv_kernel - 1) * 4
        state = self.lin_v_heads * self.lin_k_dim * self.lin_v_dim * 4
        return n * (conv + state)

    @classmethod
    def from_hf(cls, raw: dict, source: str = "config.json") -> "ModelConfig":
        """Read a transformers config (nested `text_config` for Qwen3.5) into our fields."""
        top = raw
        text = raw.get("text_config") or raw
        model_type = top.get("model_type") or text.get("model_type")
        arch = {
            "llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "qwen3",
            "qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5",
            "qwen3_5_moe": "qwen3_5_moe", "qwen3_5_moe_text": "qwen3_5_moe",
        }.get(model_type or "")
        if arch is None:
            raise ModelError(f"{source}: unknown architecture {model_type!r} (supported: {', '.join(ARCHES)})")
        try:
            heads = int(text["num_attention_heads"])
            hidden = int(text["hidden_size"])
            head_dim = int(text.get("head_dim") or hidden // heads)
            rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
            theta = text.get("rope_theta", rope.get("rope_theta", 10000.0))
            partial = text.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
            layers = int(text["num_hidden_layers"])
            layer_types = text.get("layer_types")
            if arch.startswith("qwen3_5") and not layer_types:
                interval = int(text.get("full_attention_interval", 4))
                layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers)]
            return cls(
                arch=arch,
                hidden=hidden,
                layers=layers,
                heads=heads,
                kv_heads=int(text.get("num_key_value_heads") or heads),
                head_dim=head_dim,
                vocab=int(text["vocab_size"]),
                intermediate=int(text.get("intermediate_size") or 0),
                rms_eps=float(text.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                rotary_dim=int(round(head_dim * float(partial))),
                max_position=int(text.get("max_position_embeddings") or 32768),
                tie_embeddings=bool(top.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
                qk_norm=arch != "llama",
                attn_output_gate=arch.startswith("qwen3_5") and bool(text.get("attn_output_gate", True)),
                layer_types=list(layer_types or []),
                lin_k_heads=int(text.get("linear_num_key_heads") or 0),
                lin_v_heads=int(text.get("linear_num_value_heads") or 0),
                lin_k_dim=int(text.get("linear_key_head_dim") or 0),
                lin_v_dim=int(text.get("linear_value_head_dim") or 0),
                conv_kernel=int(text.get("linear_conv_kernel_dim") or 4),
                experts=int(text.get("num_experts") or 0),
                top_k=int(text.get("num_experts_per_tok") or 0),
                expert_intermediate=int(text.get("moe_intermediate_size") or 0),
                shared_intermediate=int(text.get("shared_expert_intermediate_size") or 0),
                mtp_layers=int(text.get("mtp_num_hidden_layers") or 0),
            )
        except KeyError as e:
            raise ModelError(f"{source}: missing field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ModelError(f"{source}: bad value ({e})") from None

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        return cls.from_hf(read_json(path), str(path))


def read_json(path: str | Path) -> dict:
    """A JSON object from a file, or a ModelError naming the file."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: not a readable JSON config ({e})") from None
    if not isinstance(raw, dict):
        raise ModelError(f"{path}: a config must be a JSON object")
    return raw
