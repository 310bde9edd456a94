"""GGUF import (llama, qwen3, qwen35, qwen35moe): metadata → ModelConfig, blocks → Affine (gguf_blocks),
llama.cpp's names and layouts → canonical (gguf_names), vocabulary → BPE (gguf_vocab)."""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, LlamaFileType

from ..config import (
    FULL,
    LINEAR,
    MAX_CONV_KERNEL,
    MAX_EXPERTS,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_MTP_LAYERS,
    MAX_POSITION,
    MAX_VOCAB,
    MAX_WIDTH,
    REQUIRED,
    Fields,
    ModelConfig,
    shown,
)
from ..errors import ModelError
from ..tokenizer import Tokenizer
from ..weights import Model, Tensor
from . import gguf_blocks, gguf_names, gguf_vocab, layout

MAGIC = b"GGUF"
# llama.cpp's architecture names → ours
ARCHES = {"llama": "llama", "qwen3": "qwen3", "qwen35": "qwen3_5", "qwen35moe": "qwen3_5_moe"}


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


@functools.lru_cache(maxsize=2)
def _reader(path: str, mtime_ns: int, size: int) -> GGUFReader:
    # parsing the vocabulary takes seconds; plan() and the engine both read the same file
    return GGUFReader(path)


def read(path: Path) -> GGUFReader:
    try:
        st = path.stat()
        return _reader(str(path), st.st_mtime_ns, st.st_size)
    except FileNotFoundError:
        raise ModelError(f"{path}: no such file") from None
    except Exception as e:  # the gguf package reports truncation and garbage with assorted exceptions
        raise ModelError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


class Metadata(Mapping[str, Any]):
    """A GGUF file's metadata as plain values, each read (and decoded) when first asked for."""

    def __init__(self, r: GGUFReader, path: Path):
        self._r, self._path, self._values = r, path, {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._values:
            field = self._r.fields[key]
            try:
                self._values[key] = field.contents()
            except Exception as e:  # the gguf package decodes strings and arrays without checking them
                raise ModelError(f"{self._path}: metadata {key} is unreadable ({type(e).__name__})") from None
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._r.fields)

    def __len__(self) -> int:
        return len(self._r.fields)


def metadata(path: Path) -> Metadata:
    return Metadata(read(path), path)


def config(path: Path) -> ModelConfig:
    r = read(path)
    return config_from_metadata(Metadata(r, path), {t.name for t in r.tensors}, str(path))


def config_from_metadata(meta: Mapping[str, Any], tensor_names: set[str], source: str) -> ModelConfig:
    """ModelConfig from GGUF metadata values; every key is checked for its type and range."""
    top = Fields(meta, source, kind="metadata")
    name = top.str("general.architecture")
    if name not in ARCHES:
        raise ModelError(f"{source}: GGUF architecture {shown(name)} is not supported (supported: {', '.join(ARCHES)})")
    arch = ARCHES[name]
    m = Fields(meta, source, kind="metadata", scope=f"{name}.")
    hidden, heads = m.int("embedding_length", lo=1, hi=MAX_WIDTH), m.int("attention.head_count", lo=1, hi=MAX_HEADS)
    head_dim = m.int("attention.key_length", 0, hi=MAX_HEAD_DIM) or hidden // heads
    value_dim = m.int("attention.value_length", 0, hi=MAX_HEAD_DIM)
    if value_dim and value_dim != head_dim:
        raise m.error("attention.value_length", f"equal to the key length {head_dim}", value_dim)
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = m.int("vocab_size", 0, hi=MAX_VOCAB) or (len(tokens) if isinstance(tokens, list) else 0)
    blocks = m.int("block_count", lo=1, hi=MAX_LAYERS)
    hybrid = arch.startswith("qwen3_5")
    mtp = m.int("nextn_predict_layers", 0, hi=min(MAX_MTP_LAYERS, blocks - 1)) if hybrid else 0
    layers = blocks - mtp  # llama.cpp counts the MTP head's blocks in block_count
    rotary = m.int("rope.dimension_count", 0, hi=MAX_HEAD_DIM) or head_dim
    fields: dict[str, Any] = {}
    if hybrid:
        fields = _hybrid_fields(m, layers, rotary)
    try:
        return ModelConfig(
            arch=arch,
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=_kv_heads(m, heads),
            head_dim=head_dim,
            vocab=vocab,
            intermediate=m.int("feed_forward_length", 0 if fields.get("experts") else REQUIRED, lo=1,
                               hi=MAX_WIDTH * 16),
            rms_eps=m.float("attention.layer_norm_rms_epsilon", REQUIRED, hi=1.0),
            rope_theta=m.float("rope.freq_base", 10000.0, hi=1e12),
            rotary_dim=rotary,
            max_position=m.int("context_length", 0, hi=MAX_POSITION) or 32768,
            tie_embeddings="output.weight" not in tensor_names,
            qk_norm=arch != "llama",
            attn_output_gate=hybrid,  # llama.cpp's qwen35 always gates attention (q rows [query | gate] per head)
            mtp_layers=mtp,
            **fields,
        )
    except ModelError as e:
        raise ModelError(f"{source}: {e}") from None


def _kv_heads(m: Fields, heads: int) -> int:
    """head_count_kv: one number, or one per layer (0 for layers without attention) that must agree."""
    value = m.get("attention.head_count_kv")
    if isinstance(value, list):
        counts = {v for v in m.array("attention.head_count_kv", int) if v}
        if len(counts) > 1 or not all(1 <= v <= MAX_HEADS for v in counts):
            raise m.error("attention.head_count_kv", "one count for every attention layer", value[:4])
        return counts.pop() if counts else heads
    return m.int("attention.head_count_kv", 0, hi=MAX_HEADS) or heads


def _hybrid_fields(m: Fields, layers: int, rotary: int) -> dict[str, Any]:
    """qwen35 / qwen35moe: the Gated DeltaNet shapes (llama.cpp's ssm.* keys), the layer pattern and MoE."""
    interval = m.int("full_attention_interval", 4, lo=1, hi=layers)
    v_heads = m.int("ssm.time_step_rank", lo=1, hi=MAX_HEADS)
    inner = m.int("ssm.inner_size", lo=1, hi=MAX_HEADS * MAX_HEAD_DIM)
    if inner % v_heads:
        raise m.error("ssm.inner_size", f"a multiple of ssm.time_step_rank ({v_heads})", inner)
    sections = m.array("rope.dimension_sections", int)
    # mRoPE's sections split the rotary pairs between position axes; text uses one axis for all of them
    if sections and (len(sections) > 4 or min(sections) < 0 or 2 * sum(sections) != rotary):
        raise m.error("rope.dimension_sections", f"up to 4 counts that add up to {rotary // 2} (the rotary pairs)",
                      sections)
    experts = m.int("expert_count", 0, hi=MAX_EXPERTS)
    return {
        "layer_types": [FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers)],
        "lin_k_heads": m.int("ssm.group_count", lo=1, hi=MAX_HEADS),
        "lin_v_heads": v_heads,
        "lin_k_dim": m.int("ssm.state_size", lo=1, hi=MAX_HEAD_DIM),
        "lin_v_dim": inner // v_heads,
        "conv_kernel": m.int("ssm.conv_kernel", lo=1, hi=MAX_CONV_KERNEL),
        "experts": experts,
        "top_k": m.int("expert_used_count", lo=1, hi=experts) if experts else 0,
        "expert_intermediate": m.int("expert_feed_forward_length", lo=1, hi=MAX_WIDTH * 16) if experts else 0,
        "shared_intermediate": m.int("expert_shared_feed_forward_length", 0, hi=MAX_WIDTH * 16) if experts else 0,
    }


def quant_label(path: Path) -> str:
    """The file's quantization as llama.cpp names it (Q4_1, Q8_0, F16, ...)."""
    ftype = metadata(path).get("general.file_type")
    try:
        return LlamaFileType(ftype).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        return "unknown"


def _tensor(t: Any, path: Path) -> Tensor:
    shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dimensions innermost first
    where = f"{path}: tensor {t.name}"
    if not shape or not all(shape):
        raise ModelError(f"{where} has shape {list(shape)}")
    try:
        kind = QT(t.tensor_type)
    except ValueError:
        raise ModelError(f"{where} has an unknown type {shown(t.tensor_type)}") from None
    if kind not in gguf_blocks.SUPPORTED:
        raise ModelError(f"{where} has type {kind.name}, which is not supported "
                         f"({', '.join(q.name for q in gguf_blocks.SUPPORTED)})")
    if kind in gguf_blocks.QUANTIZED:
        return gguf_blocks.decode(kind, t.data, shape, where)
    data = np.asarray(t.data)
    if data.size != int(np.prod(shape)):
        raise ModelError(f"{where} holds {data.size} values for shape {list(shape)}")
    if kind == QT.BF16:
        return data.view(ml_dtypes.bfloat16).astype(np.float32).reshape(shape)
    return np.asarray(data, dtype=np.float32).reshape(shape)


def load(path: Path, progress: Callable[[str, float], None] | None = None) -> Model:
    cfg = config(path)
    r = read(path)
    weights: dict[str, Tensor] = {}
    origin: dict[str, str] = {}
    for i, t in enumerate(r.tensors):
        name = gguf_names.canonical(t.name, cfg)
        if name is None:
            raise ModelError(f"{path}: tensor {t.name} is not part of a {cfg.arch} model this engine runs")
        if name:
            where = f"{path}: tensor {t.name}"
            weights[name] = gguf_names.to_canonical(name, _tensor(t, path), cfg, where)
            origin[name] = where
        if progress:
            progress("loading weights", (i + 1) / len(r.tensors))
    layout.finish(weights, cfg, origin, str(path), shift_norms=False)
    tok = tokenizer(path)
    layout.check_tokenizer(tok, cfg, str(path))
    return Model(cfg, weights, tok, name=display_name(path), source=str(path), format="gguf",
                 meta={"label": f"GGUF {quant_label(path)}", "dropped": []})


def tokenizer(path: Path) -> Tokenizer:
    """A `tokenizers` byte-level BPE equal to the model's own tokenizer.json, from the GGUF metadata."""
    return gguf_vocab.from_metadata(metadata(path), str(path))


def display_name(path: Path) -> str:
    """The file name without its quantization suffix: SmolLM2-135M-Instruct.Q4_1.gguf → SmolLM2-135M-Instruct."""
    stem = path.name.removesuffix(".gguf")
    return re.sub(r"[.-](?:I?Q\d\w*|F16|F32|BF16)$", "", stem, flags=re.IGNORECASE) or stem


