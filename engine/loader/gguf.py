"""GGUF import (llama, qwen3): metadata → ModelConfig, Q4_1/Q8_0 blocks → MLX-order Affine, vocab → BPE."""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import ml_dtypes
import numpy as np
import tokenizers
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, LlamaFileType
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors

from ..config import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
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
from ..weights import Affine, Model, Tensor
from . import layout

MAGIC = b"GGUF"
ARCHES = ("llama", "qwen3")
GLOBAL = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
SUPPORTED = (QT.F32, QT.F16, QT.BF16, QT.Q4_1, QT.Q8_0)
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values
# llama.cpp ends generation on these control tokens whatever the metadata's eos id says.
END_OF_GENERATION = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<EOT>"}

# Pre-tokenizers as the models' own tokenizer.json files define them, keyed by llama.cpp's name.
_DIGITS_BYTELEVEL = ("smollm", "starcoder", "refact", "codeshell")
_SPLIT_RE = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}


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
    arch = top.str("general.architecture")
    if arch not in ARCHES:
        raise ModelError(f"{source}: GGUF architecture {shown(arch)} is not supported (supported: {', '.join(ARCHES)})")
    m = Fields(meta, source, kind="metadata", scope=f"{arch}.")
    hidden, heads = m.int("embedding_length", lo=1, hi=MAX_WIDTH), m.int("attention.head_count", lo=1, hi=MAX_HEADS)
    head_dim = m.int("attention.key_length", 0, hi=MAX_HEAD_DIM) or hidden // heads
    value_dim = m.int("attention.value_length", 0, hi=MAX_HEAD_DIM)
    if value_dim and value_dim != head_dim:
        raise m.error("attention.value_length", f"equal to the key length {head_dim}", value_dim)
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = m.int("vocab_size", 0, hi=MAX_VOCAB) or (len(tokens) if isinstance(tokens, list) else 0)
    try:
        return ModelConfig(
            arch=arch,
            hidden=hidden,
            layers=m.int("block_count", lo=1, hi=MAX_LAYERS),
            heads=heads,
            kv_heads=m.int("attention.head_count_kv", 0, hi=MAX_HEADS) or heads,
            head_dim=head_dim,
            vocab=vocab,
            intermediate=m.int("feed_forward_length", lo=1, hi=MAX_WIDTH * 16),
            rms_eps=m.float("attention.layer_norm_rms_epsilon", REQUIRED, hi=1.0),
            rope_theta=m.float("rope.freq_base", 10000.0, hi=1e12),
            rotary_dim=m.int("rope.dimension_count", 0, hi=MAX_HEAD_DIM) or head_dim,
            max_position=m.int("context_length", 0, hi=MAX_POSITION) or 32768,
            tie_embeddings="output.weight" not in tensor_names,
            qk_norm=arch == "qwen3",
        )
    except ModelError as e:
        raise ModelError(f"{source}: {e}") from None


def quant_label(path: Path) -> str:
    """The file's quantization as llama.cpp names it (Q4_1, Q8_0, F16, ...)."""
    ftype = metadata(path).get("general.file_type")
    try:
        return LlamaFileType(ftype).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        return "unknown"


def _canonical(name: str) -> str | None:
    base, _, kind = name.rpartition(".")
    suffix = "" if kind == "weight" else ".bias" if kind == "bias" else None
    if suffix is None:
        return None
    if base in GLOBAL:
        return GLOBAL[base] + suffix
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m and m[2] in BLOCK:
        return f"layers.{m[1]}.{BLOCK[m[2]]}{suffix}"
    return None


def _blocks(data: np.ndarray, rows: int, block_bytes: int) -> np.ndarray:
    return np.ascontiguousarray(data).reshape(rows, -1, block_bytes)


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte `at` of every block."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0]


def _q4_1(data: np.ndarray, rows: int) -> Affine:
    # block: f16 d, f16 m, 16 bytes; byte j holds element j (low nibble) and element j+16 (high nibble)
    b = _blocks(data, rows, 20)
    qs = b[..., 4:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [rows, blocks, 32] in element order
    # MLX order: element k of a little-endian word in bits [4k, 4k+4), so byte i = elements 2i, 2i+1
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(rows, -1).view("<u4")
    return Affine(packed, _f16(b, 0), _f16(b, 2), bits=4, group=32)


def _q8_0(data: np.ndarray, rows: int) -> Affine:
    # block: f16 d, 32 int8; w = d·q = d·(q+128) − 128·d, and q+128 as a byte is q's byte xor 0x80
    b = _blocks(data, rows, 34)
    packed = (b[..., 2:] ^ 0x80).reshape(rows, -1).view("<u4")
    d = _f16(b, 0)
    return Affine(packed, d, (d * np.float16(-128)).astype(np.float16), bits=8, group=32)


def _tensor(t: Any, path: Path) -> Tensor:
    shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dimensions innermost first
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    kind = QT(t.tensor_type)
    if not shape or not all(shape):
        raise ModelError(f"{path}: tensor {t.name} has shape {list(shape)}")
    if kind in (QT.Q4_1, QT.Q8_0):
        block = 20 if kind == QT.Q4_1 else 34
        if len(shape) != 2 or shape[-1] % 32 or np.asarray(t.data).nbytes != rows * shape[-1] // 32 * block:
            raise ModelError(f"{path}: tensor {t.name} is {kind.name} but has shape {list(shape)} "
                             f"({np.asarray(t.data).nbytes} bytes)")
    elif np.asarray(t.data).size != int(np.prod(shape)):
        raise ModelError(f"{path}: tensor {t.name} holds {np.asarray(t.data).size} values for shape {list(shape)}")
    if kind == QT.Q4_1:
        w = _q4_1(t.data, rows)
    elif kind == QT.Q8_0:
        w = _q8_0(t.data, rows)
    elif kind == QT.BF16:
        w = np.asarray(t.data).view(ml_dtypes.bfloat16).astype(np.float32)
    else:
        w = np.asarray(t.data, dtype=np.float32)
    return w if isinstance(w, Affine) else w.reshape(shape)


def _unpermute(w: Tensor, n_head: int) -> Tensor:
    """Undo llama.cpp's q/k row order (interleaved RoPE pairs) so that every model uses NeoX RoPE.

    The converter did rows.reshape(n_head, 2, hd/2).swapaxes(1, 2); the inverse reads the stored rows
    as (n_head, hd/2, 2) and swaps back.
    """
    out = w.shape[-2] if len(w.shape) > 1 else w.shape[0]
    order = np.arange(out).reshape(n_head, out // n_head // 2, 2).swapaxes(1, 2).reshape(-1)
    return layout.rows(w, order)


def load(path: Path, progress: Callable[[str, float], None] | None = None) -> Model:
    cfg = config(path)
    r = read(path)
    weights: dict[str, Tensor] = {}
    origin: dict[str, str] = {}
    for i, t in enumerate(r.tensors):
        name = _canonical(t.name)
        if name is None:
            raise ModelError(f"{path}: tensor {t.name} is not part of a {cfg.arch} model this engine runs")
        if t.tensor_type not in SUPPORTED:
            raise ModelError(f"{path}: tensor {t.name} has type {QT(t.tensor_type).name}, which is not supported "
                             f"({', '.join(q.name for q in SUPPORTED)})")
        w = _tensor(t, path)
        if cfg.arch == "llama" and name.removesuffix(".bias").endswith(("q_proj", "k_proj")):
            n_head = cfg.heads if ".q_proj" in name else cfg.kv_heads
            out = w.shape[-2] if len(w.shape) > 1 else w.shape[0]
            if out != n_head * cfg.head_dim or cfg.head_dim % 2:
                raise ModelError(f"{path}: tensor {t.name} has {out} rows, but RoPE over {n_head} heads of "
                                 f"{cfg.head_dim} (an even size) needs {n_head * cfg.head_dim}")
            w = _unpermute(w, n_head)
        weights[name], origin[name] = w, f"{path}: tensor {t.name}"
        if progress:
            progress("loading weights", (i + 1) / len(r.tensors))
    layout.finish(weights, cfg, origin, str(path), shift_norms=False)
    tok = tokenizer(path)
    layout.check_tokenizer(tok, cfg, str(path))
    return Model(cfg, weights, tok, name=display_name(path), source=str(path), format="gguf",
                 meta={"label": f"GGUF {quant_label(path)}", "dropped": []})


def display_name(path: Path) -> str:
    """The file name without its quantization suffix: SmolLM2-135M-Instruct.Q4_1.gguf → SmolLM2-135M-Instruct."""
    stem = path.name.removesuffix(".gguf")
    return re.sub(r"[.-](?:I?Q\d\w*|F16|F32|BF16)$", "", stem, flags=re.IGNORECASE) or stem


def _pre_tokenizer(pre: str, path: str) -> tuple[Any, Any]:
    """(normalizer, pre-tokenizer) for llama.cpp's pre-tokenizer name."""
    if pre in _DIGITS_BYTELEVEL:
        return None, pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in ("gpt-2", "default"):
        return None, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _SPLIT_RE:
        split = pre_tokenizers.Split(Regex(_SPLIT_RE[pre]), behavior="isolated", invert=False)
        seq = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        return (normalizers.NFC() if pre == "qwen2" else None), seq
    known = ", ".join((*_DIGITS_BYTELEVEL, "gpt-2", *_SPLIT_RE))
    raise ModelError(f"{path}: tokenizer pre-tokenizer {shown(pre)} is not supported (supported: {known})")


def tokenizer(path: Path) -> Tokenizer:
    """A `tokenizers` byte-level BPE equal to the model's own tokenizer.json, from the GGUF metadata."""
    return tokenizer_from_metadata(metadata(path), str(path))


def tokenizer_from_metadata(meta: Mapping[str, Any], source: str) -> Tokenizer:
    m = Fields(meta, source, kind="metadata", scope="tokenizer.")
    model = m.str("ggml.model")
    if model != "gpt2":
        raise ModelError(f"{source}: tokenizer model {shown(model)} is not supported (only gpt2-style BPE)")
    tokens = _list(m, "ggml.tokens", str)
    if not tokens or len(tokens) > MAX_VOCAB:
        raise m.error("ggml.tokens", f"a list of 1..{MAX_VOCAB} strings", len(tokens))
    types = _list(m, "ggml.token_type", int) or [1] * len(tokens)
    if len(types) != len(tokens):
        raise m.error("ggml.token_type", f"one type per token ({len(tokens)})", len(types))
    merges = [tuple(x.split(" ", 1)) for x in _list(m, "ggml.merges", str)]
    if any(len(x) != 2 for x in merges):
        raise m.error("ggml.merges", "a list of 'left right' pairs")
    pre = m.str("ggml.pre", "default")
    normalizer, pre_tok = _pre_tokenizer(pre, source)
    ids = {name: m.int(f"ggml.{name}_token_id", None, hi=len(tokens) - 1) for name in ("bos", "eos", "eot", "eom")}
    bos = ids["bos"]
    try:
        bpe = tokenizers.models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                    ignore_merges=pre == "llama-bpe")
        tk = tokenizers.Tokenizer(bpe)
        if normalizer is not None:
            tk.normalizer = normalizer
        tk.pre_tokenizer = pre_tok
        tk.decoder = decoders.ByteLevel()
        tk.add_tokens([AddedToken(t, special=y == CONTROL, normalized=False)
                       for t, y in zip(tokens, types) if y in (CONTROL, USER_DEFINED)])
        if bos is not None and m.bool("ggml.add_bos_token", False):
            tk.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B",
                                                              special_tokens=[(tokens[bos], bos)])
    except Exception as e:  # the Rust side reports a vocabulary it cannot build as a plain Exception
        raise ModelError(f"{source}: the tokenizer cannot be built from the metadata ({_one_line(e)})") from None
    eos_ids = {i for k, i in ids.items() if k != "bos" and i is not None}
    eos_ids |= {i for i, (t, y) in enumerate(zip(tokens, types)) if y == CONTROL and t in END_OF_GENERATION}
    eos = ids["eos"]
    return Tokenizer(tk, source=source, chat_template=m.str("chat_template"), eos_ids=eos_ids,
                     bos_id=bos, eos_token=tokens[eos] if eos is not None else None)


def _list(m: Fields, key: str, kind: type) -> list:
    """A metadata array whose entries are all of one type (empty when missing)."""
    value = m.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise m.error(key, f"a list of {kind.__name__}s", value if not isinstance(value, list) else value[:3])
    return value


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."
