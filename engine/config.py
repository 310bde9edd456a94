"""ModelConfig: the shapes of one model, read from a Hugging Face config.json or GGUF metadata."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from . import jsonfile
from .errors import ModelError

ARCHES = ("llama", "qwen3", "qwen3_5", "qwen3_5_moe")
HF_ARCHES = {
    "llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "qwen3",
    "qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5", "qwen3_5_moe": "qwen3_5_moe", "qwen3_5_moe_text": "qwen3_5_moe",
}
FULL, LINEAR = "full_attention", "linear_attention"
# Bounds well past every released model; beyond them a config is broken, and shapes built from it
# (a layer list, the expected-tensor table) would take the memory a plan never counted.
MAX_LAYERS, MAX_WIDTH, MAX_HEADS, MAX_HEAD_DIM = 1024, 1 << 17, 1024, 4096
MAX_VOCAB, MAX_POSITION, MAX_EXPERTS, MAX_CONV_KERNEL, MAX_MTP_LAYERS = 1 << 22, 1 << 31, 1 << 14, 64, 16
REQUIRED = object()


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
        """Consistency of the fields with each other; the readers have checked each one's type and range."""
        if self.arch not in ARCHES:
            raise ModelError(f"unknown architecture {self.arch!r} (supported: {', '.join(ARCHES)})")
        for name, hi in (("layers", MAX_LAYERS), ("hidden", MAX_WIDTH), ("heads", MAX_HEADS),
                         ("kv_heads", MAX_HEADS), ("head_dim", MAX_HEAD_DIM), ("vocab", MAX_VOCAB)):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= hi:
                raise ModelError(f"config field {name} must be an integer in 1..{hi}, got {value!r}")
        if not self.rotary_dim:
            self.rotary_dim = self.head_dim
        if not self.layer_types:
            self.layer_types = [FULL] * self.layers
        if len(self.layer_types) != self.layers:
            raise ModelError(f"layer_types has {len(self.layer_types)} entries for {self.layers} layers")
        kinds = (FULL, LINEAR) if self.arch.startswith("qwen3_5") else (FULL,)
        for i, kind in enumerate(self.layer_types):
            if kind not in kinds:
                raise ModelError(f"layer_types[{i}] is {kind!r}; a {self.arch} layer is one of {', '.join(kinds)}")
        if self.heads % self.kv_heads:
            raise ModelError(f"{self.heads} attention heads do not divide into {self.kv_heads} kv heads")
        if self.rotary_dim % 2 or not 2 <= self.rotary_dim <= self.head_dim:
            raise ModelError(f"the rotary dimension must be even and in 2..{self.head_dim} (the head dimension), "
                             f"got {self.rotary_dim}")
        for name in ("rms_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ModelError(f"config field {name} must be a positive finite number, got {value!r}")
            setattr(self, name, float(value))
        if not 1 <= self.max_position <= MAX_POSITION:
            raise ModelError(f"config field max_position must be in 1..{MAX_POSITION}, got {self.max_position}")
        if self.linear_layers:
            for name in ("lin_k_heads", "lin_v_heads", "lin_k_dim", "lin_v_dim", "conv_kernel"):
                if getattr(self, name) < 1:
                    raise ModelError(f"config field {name} must be positive for linear-attention layers, "
                                     f"got {getattr(self, name)}")
            if self.lin_v_heads % self.lin_k_heads:
                raise ModelError(f"{self.lin_v_heads} linear value heads do not divide into {self.lin_k_heads} "
                                 f"key heads")
        if self.experts and self.arch != "qwen3_5_moe":
            raise ModelError(f"a {self.arch} model has no experts, but the config gives {self.experts}")
        if self.experts and not (1 <= self.top_k <= self.experts and self.expert_intermediate >= 1):
            raise ModelError(f"{self.experts} experts need 1..{self.experts} experts per token and a positive "
                             f"expert width, got {self.top_k} and {self.expert_intermediate}")

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == FULL]

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == LINEAR]

    @property
    def conv_channels(self) -> int:
        return 2 * self.lin_k_heads * self.lin_k_dim + self.lin_v_heads * self.lin_v_dim

    def kv_bytes_per_token(self, kv_dtype: str, extra_layers: int = 0) -> int:
        """K and V of every attention layer (+ a drafter's `extra_layers`) for one token; fp8 adds one
        fp32 scale per head and row."""
        per_head = self.head_dim * 2 if kv_dtype == "bf16" else self.head_dim + 4
        return (len(self.attention_layers) + extra_layers) * 2 * self.kv_heads * per_head

    def state_bytes_per_stream(self) -> int:
        """DeltaNet conv rows (fp32) and recurrent state (fp32) that one stream keeps, never paged."""
        n, conv, state, _ = self._recurrent_sizes()
        return n * (conv + state)

    def _recurrent_sizes(self) -> tuple[int, int, int, int]:
        """(linear layers, bytes of a layer's conv rows, of its state, of a window row's log of it)."""
        return (len(self.linear_layers), self.conv_channels * (self.conv_kernel - 1) * 4,
                self.lin_v_heads * self.lin_k_dim * self.lin_v_dim * 4,
                self.lin_v_heads * (self.lin_k_dim + self.lin_v_dim + 1) * 4)

    def recurrent_bytes(self, lanes: int, drafts: int) -> int:
        """The cache's recurrent slots for `lanes` streams with verify windows of `drafts` rows more
        (kv.cache.Cache): conv rows in each window row's slot and the states in the lanes' alone (each
        plus a scratch slot, and a checkpoint slot a lane), and per lane and row after the first the
        state's log, k̂, δ and e^g of every value head."""
        n, conv, state, log = self._recurrent_sizes()
        return n * (((lanes + 1) * (drafts + 1) + lanes) * conv + (2 * lanes + 1) * state + (lanes + 1) * drafts * log)

    @classmethod
    def from_hf(cls, raw: Any, source: str = "config.json") -> "ModelConfig":
        """Read a transformers config (nested `text_config` for Qwen3.5) into our fields."""
        if not isinstance(raw, dict):
            raise ModelError(f"{source}: a config must be a JSON object")
        top = Fields(raw, source)
        nested = top.object("text_config")
        text = Fields(nested, source, "text_config.") if nested else top
        model_type = top.str("model_type") or text.str("model_type")
        arch = HF_ARCHES.get(model_type or "")
        if arch is None:
            raise ModelError(f"{source}: unknown architecture {shown(model_type)} (supported: {', '.join(ARCHES)})")
        heads = text.int("num_attention_heads", lo=1, hi=MAX_HEADS)
        hidden = text.int("hidden_size", lo=1, hi=MAX_WIDTH)
        head_dim = text.int("head_dim", 0, hi=MAX_HEAD_DIM) or hidden // heads
        rope_key = "rope_parameters" if text.get("rope_parameters") else "rope_scaling"
        rope = Fields(text.object(rope_key), source, f"{text.prefix}{rope_key}.")
        theta = text.float("rope_theta", None, hi=1e12)
        theta = rope.float("rope_theta", 10000.0, hi=1e12) if theta is None else theta
        partial = text.float("partial_rotary_factor", None, hi=1.0)
        partial = rope.float("partial_rotary_factor", 1.0, hi=1.0) if partial is None else partial
        layers = text.int("num_hidden_layers", lo=1, hi=MAX_LAYERS)
        layer_types = text.strings("layer_types", layers)
        if arch.startswith("qwen3_5") and not layer_types:
            interval = text.int("full_attention_interval", 4, lo=1, hi=layers)
            layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers)]
        tie = top.bool("tie_word_embeddings", None)
        experts = text.int("num_experts", 0, hi=MAX_EXPERTS)
        try:
            return cls(
                arch=arch,
                hidden=hidden,
                layers=layers,
                heads=heads,
                kv_heads=text.int("num_key_value_heads", 0, hi=MAX_HEADS) or heads,
                head_dim=head_dim,
                vocab=text.int("vocab_size", lo=1, hi=MAX_VOCAB),
                intermediate=text.int("intermediate_size", 0, hi=MAX_WIDTH * 16),
                rms_eps=text.float("rms_norm_eps", 1e-6, hi=1.0),
                rope_theta=theta,
                rotary_dim=int(round(head_dim * partial)),
                max_position=text.int("max_position_embeddings", 0, hi=MAX_POSITION) or 32768,
                tie_embeddings=text.bool("tie_word_embeddings", False) if tie is None else tie,
                qk_norm=arch != "llama",
                attn_output_gate=arch.startswith("qwen3_5") and text.bool("attn_output_gate", True),
                layer_types=layer_types,
                lin_k_heads=text.int("linear_num_key_heads", 0, hi=MAX_HEADS),
                lin_v_heads=text.int("linear_num_value_heads", 0, hi=MAX_HEADS),
                lin_k_dim=text.int("linear_key_head_dim", 0, hi=MAX_HEAD_DIM),
                lin_v_dim=text.int("linear_value_head_dim", 0, hi=MAX_HEAD_DIM),
                conv_kernel=text.int("linear_conv_kernel_dim", 0, hi=MAX_CONV_KERNEL) or 4,
                experts=experts,
                top_k=text.int("num_experts_per_tok", 0, hi=experts) if experts else 0,
                expert_intermediate=text.int("moe_intermediate_size", 0, hi=MAX_WIDTH * 16),
                shared_intermediate=text.int("shared_expert_intermediate_size", 0, hi=MAX_WIDTH * 16),
                mtp_layers=text.int("mtp_num_hidden_layers", 0, hi=MAX_MTP_LAYERS),
            )
        except ModelError as e:
            raise ModelError(f"{source}: {e}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        return cls.from_hf(read_json(path), str(path))


class Fields:
    """Typed, range-checked reads of one JSON object (or GGUF metadata); each error names the file
    and the field. A field that is missing or null takes the default; `required` fields have none."""

    def __init__(self, raw: Mapping[str, Any] | None, source: str, prefix: str = "", kind: str = "field",
                 scope: str = ""):
        # `prefix` is where `raw` sits in its file (messages only); `scope` is prepended to every key
        self.raw, self.source, self.kind, self.scope = raw or {}, source, kind, scope
        self.prefix = prefix + scope

    def error(self, key: str, want: str, value: Any = None) -> ModelError:
        got = f", got {shown(value)}" if value is not None else ""
        return ModelError(f"{self.source}: {self.kind} {self.prefix}{key} must be {want}{got}")

    def get(self, key: str) -> Any:
        return self.raw.get(self.scope + key)

    def int(self, key: str, default: Any = REQUIRED, lo: int = 0, hi: int = 1 << 31) -> int:
        value = self.get(key)
        if value is None:
            if default is REQUIRED:
                raise ModelError(f"{self.source}: {self.kind} {self.prefix}{key} is missing")
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.error(key, f"an integer in {lo}..{hi}", value)
        return value

    def float(self, key: str, default: Any, hi: float) -> float:
        """A finite number in (0, hi]."""
        value = self.get(key)
        if value is None:
            if default is REQUIRED:
                raise ModelError(f"{self.source}: {self.kind} {self.prefix}{key} is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= hi:
            raise self.error(key, f"a number in (0, {hi:g}]", value)
        return float(value)

    def bool(self, key: str, default: Any) -> Any:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, "true or false", value)
        return value

    def str(self, key: str, default: Any = None) -> Any:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(key, "a string", value)
        return value

    def object(self, key: str) -> dict | None:
        value = self.get(key)
        if value is not None and not isinstance(value, dict):
            raise self.error(key, "an object", value)
        return value or None

    def array(self, key: str, kind: type) -> list:
        """A list whose entries are all of one type (empty when missing); bools are not ints."""
        value = self.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
            raise self.error(key, f"a list of {kind.__name__}s", value if not isinstance(value, list) else value[:3])
        return value

    def strings(self, key: str, most: int) -> list[str]:
        """A list of at most `most` strings (empty when missing)."""
        value = self.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > most or not all(isinstance(v, str) for v in value):
            raise self.error(key, f"a list of at most {most} strings", value)
        return value


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_json(path: str | Path, max_bytes: int = jsonfile.MAX_BYTES) -> dict:
    """A JSON object from a file, or a ModelError naming the file."""
    path = Path(path)
    try:
        raw = jsonfile.read(path, max_bytes=max_bytes)
    except FileNotFoundError:
        raise ModelError(f"{path}: no such file") from None
    except OSError as e:
        raise ModelError(f"{path}: cannot read ({e.strerror or e})") from None
    except ValueError as e:
        raise ModelError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(raw, dict):
        raise ModelError(f"{path}: must be a JSON object")
    return raw
