"""File mutators for `make fuzz` (tests/fuzz.py): GGUF written byte by byte, JSON of any shape,
safetensors headers that lie. Each mutator takes a random generator and returns a one-line
description of what it did, so a failing case can be told and reproduced."""
from __future__ import annotations

import json
import math
import random
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# GGUF value types (gguf.GGUFValueType), written here directly so any type can sit under any key.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_PACK = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
         U64: "<Q", I64: "<q", F64: "<d"}

# Values that have broken readers: wrong types, signs, widths, non-finite numbers, nesting.
NASTY: list[Any] = [
    None, True, False, 0, -1, 1, 2, 3, 7, 17, 2**31, 2**32 + 1, 2**63, 2**64, 10**30, -2**63, 2_000_000,
    1.5, -0.0, 1e-300, 1e308, math.inf, -math.inf, math.nan, "", "x", "4096", "full_attention", "\ud800",
    "a" * 5000, [], [1], [1.5], ["x"], [[1]], [None], [2, [3]], {}, {"a": 1}, {"bits": 4}, {"content": 5},
]


DEEP = "@@deep:"  # a placeholder that `dump` writes as nested lists (too deep for json.dumps)


def nasty(rng: random.Random) -> Any:
    return rng.choice(NASTY)


def deep_json(depth: int, kind: str = "list") -> str:
    return ("[" * depth + "]" * depth) if kind == "list" else ('{"a":' * depth + "1" + "}" * depth)


# --- JSON mutations ----------------------------------------------------------------------------

def paths_of(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path into nested dicts and lists (lists: their first three entries)."""
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths_of(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            out += paths_of(v, prefix + (i,))
    return out


def set_path(obj: Any, path: tuple, value: Any, delete: bool = False) -> None:
    for k in path[:-1]:
        obj = obj[k]
    if delete and isinstance(obj, dict):
        obj.pop(path[-1], None)
    else:
        obj[path[-1]] = value


def mutate_json_value(rng: random.Random, obj: Any, focus: list[tuple] | None = None) -> str:
    """Change one value (or key) of `obj` in place; returns what was done."""
    paths = paths_of(obj)
    if focus and rng.random() < 0.6:
        paths = [p for p in focus if _has(obj, p)] or paths
    if not paths:
        return "nothing to change"
    path = rng.choice(paths)
    r = rng.random()
    if r < 0.1 and isinstance(path[-1], str):
        set_path(obj, path, None, delete=True)
        return f"deleted {_name(path)}"
    if r < 0.15:
        depth = rng.choice([100, 1000, 100_000])
        set_path(obj, path, f"{DEEP}{depth}")
        return f"{_name(path)} nested {depth} deep"
    value = nasty(rng)
    set_path(obj, path, value)
    return f"{_name(path)} = {_short(value)}"


def _has(obj: Any, path: tuple) -> bool:
    try:
        for k in path:  # only through containers: a string's characters are not paths
            if not isinstance(obj, (dict, list)):
                return False
            obj = obj[k]
        return True
    except (KeyError, IndexError, TypeError):
        return False


def _name(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def dump(obj: Any) -> str:
    """json.dumps, with each DEEP placeholder written as that many nested lists."""
    return re.sub(f'"{DEEP}(\\d+)"', lambda m: deep_json(int(m[1])), json.dumps(obj))


def mutate_json_text(rng: random.Random, text: str) -> tuple[bytes, str]:
    """Byte-level damage to a JSON document."""
    data = text.encode("utf-8", "surrogatepass")
    r = rng.random()
    if r < 0.2 and data:
        cut = rng.randrange(len(data))
        return data[:cut], f"truncated at {cut}"
    if r < 0.35:
        return b"\xff\xfe" + data, "non-UTF-8 prefix"
    if r < 0.5:
        return deep_json(rng.choice([10_000, 100_000]), rng.choice(["list", "dict"])).encode(), "deeply nested"
    if r < 0.6:
        return b"[" + data + b"]", "wrapped in a list"
    if r < 0.7:
        return (text[:-1] + ', "pad": "' + "x" * (20 << 20) + '"}').encode(), "20 MB larger"
    data = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if data:
            data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data), "bytes flipped"


# --- GGUF, byte by byte ------------------------------------------------------------------------

@dataclass
class KV:
    key: str
    vtype: int
    value: Any  # python value; for ARR: (sub type, list)


@dataclass
class GTensor:
    name: str
    dims: list[int]  # innermost first, as stored
    ggml_type: int
    data: bytes


def read_gguf(path: Path) -> tuple[list[KV], list[GTensor]]:
    import gguf
    r = gguf.GGUFReader(str(path))
    kvs = []
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        main = int(f.types[0])
        value = f.contents()
        if main == ARR:
            value = (int(f.types[-1]), value)
        kvs.append(KV(name, main, value))
    tensors = [GTensor(t.name, [int(d) for d in t.shape], int(t.tensor_type), bytes(t.data.tobytes()))
               for t in r.tensors]
    return kvs, tensors


def _pack_value(vtype: int, value: Any) -> bytes:
    if vtype in _PACK:
        return struct.pack(_PACK[vtype], value)
    if vtype == STR:
        raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
        return struct.pack("<Q", len(raw)) + raw
    if vtype == ARR:
        sub, items = value
        return struct.pack("<IQ", sub, len(items)) + b"".join(_pack_value(sub, v) for v in items)
    raise ValueError(vtype)


def write_gguf(path: Path, kvs: list[KV], tensors: list[GTensor], alignment: int = 32,
               counts: tuple[int, int] | None = None) -> None:
    out = bytearray(b"GGUF" + struct.pack("<I", 3))
    n_t, n_kv = counts or (len(tensors), len(kvs))
    out += struct.pack("<QQ", n_t, n_kv)
    for kv in kvs:
        out += _pack_value(STR, kv.key) + struct.pack("<I", kv.vtype) + _pack_value(kv.vtype, kv.value)
    offset, blobs = 0, []
    for t in tensors:
        out += _pack_value(STR, t.name) + struct.pack("<I", len(t.dims))
        out += b"".join(struct.pack("<Q", d & (2**64 - 1)) for d in t.dims)
        out += struct.pack("<IQ", t.ggml_type & 0xFFFFFFFF, offset)
        pad = -len(t.data) % alignment
        blobs.append(t.data + b"\0" * pad)
        offset += len(t.data) + pad
    out += b"\0" * (-len(out) % alignment)
    path.write_bytes(bytes(out) + b"".join(blobs))


# Keys that broke the loader, with the values that broke it; other keys get NASTY values.
GGUF_FOCUS: dict[str, list[tuple[int, Any]]] = {
    "rope.freq_base": [(STR, "10000"), (F32, math.nan), (F32, math.inf), (F32, -1.0), (I32, 0)],
    "context_length": [(ARR, (U32, [1, 2])), (I64, -5), (U64, 2**63), (F32, 512.0), (STR, "x")],
    "rope.dimension_count": [(I32, -1), (U32, 10_000), (U32, 3), (U32, 0), (U32, 18), (U32, 2**31)],
    "block_count": [(U32, 2_000_000), (U32, 0), (I32, -2), (U64, 2**62), (F32, 2.0), (STR, "2")],
    "embedding_length": [(U32, 0), (U32, 2**31), (U32, 63), (F64, 64.0), (BOOL, True)],
    "attention.head_count": [(U32, 0), (U32, 3), (U32, 1000), (I32, -4)],
    "attention.head_count_kv": [(U32, 0), (U32, 3), (U32, 64)],
    "attention.key_length": [(U32, 0), (U32, 15), (U32, 10_000)],
    "attention.layer_norm_rms_epsilon": [(F32, -1.0), (F32, math.nan), (STR, "1e-5"), (F32, 0.0)],
    "feed_forward_length": [(U32, 0), (U32, 2**30), (U32, 127)],
    "vocab_size": [(U32, 0), (U32, 2**31), (U32, 10)],
    "tokenizer.ggml.merges": [(ARR, (I32, [1, 2, 3])), (ARR, (STR, ["ab"])), (ARR, (STR, [])), (STR, "a b")],
    "tokenizer.ggml.eos_token_id": [(F32, 2.0), (I32, -1), (U32, 10**9), (STR, "2"), (ARR, (U32, [2]))],
    "tokenizer.ggml.bos_token_id": [(F32, 1.0), (U32, 10**9), (I32, -3)],
    "tokenizer.ggml.tokens": [(ARR, (STR, [])), (ARR, (I32, [1, 2])), (STR, "abc"), (ARR, (STR, [b"\xff\xfe"] * 3))],
    "tokenizer.ggml.token_type": [(ARR, (I32, [1])), (ARR, (STR, ["x"])), (ARR, (F32, [1.0]))],
    "tokenizer.ggml.model": [(STR, "llama"), (I32, 1), (STR, b"\xff")],
    "tokenizer.ggml.pre": [(STR, "mystery"), (I32, 3)],
    "tokenizer.chat_template": [(I32, 5), (ARR, (STR, ["x"])), (STR, "{% for %}"), (STR, b"\xff\xfe")],
    "general.architecture": [(STR, "falcon"), (I32, 1), (STR, "")],
    "tokenizer.ggml.add_bos_token": [(STR, "yes"), (I32, 1)],
    # qwen35 / qwen35moe: the Gated DeltaNet shapes, the layer pattern, the MTP head, experts
    "ssm.time_step_rank": [(U32, 0), (U32, 3), (U32, 2**31), (F32, 4.0)],
    "ssm.inner_size": [(U32, 0), (U32, 7), (U32, 2**30), (I32, -64)],
    "ssm.group_count": [(U32, 0), (U32, 3), (U32, 1000)],
    "ssm.state_size": [(U32, 0), (U32, 5000), (STR, "16")],
    "ssm.conv_kernel": [(U32, 0), (U32, 1), (U32, 65), (U32, 2**32 - 1)],
    "full_attention_interval": [(U32, 0), (U32, 1), (U32, 100), (I32, -1), (ARR, (U32, [4]))],
    "nextn_predict_layers": [(U32, 0), (U32, 1), (U32, 2), (U32, 100), (I32, -1)],
    "expert_count": [(U32, 0), (U32, 1), (U32, 2**20)],
    "expert_used_count": [(U32, 0), (U32, 100)],
    "expert_feed_forward_length": [(U32, 0), (U32, 2**30)],
    "rope.dimension_sections": [(ARR, (I32, [-1, 0, 0, 0])), (ARR, (I32, [100, 0, 0, 0])), (ARR, (STR, ["x"])),
                                (ARR, (I32, [1] * 10)), (U32, 4)],
    "attention.value_length": [(U32, 0), (U32, 15), (U32, 10_000)],
}


def _random_kv_value(rng: random.Random) -> tuple[int, Any]:
    kind = rng.choice([U8, I8, U32, I32, U64, I64, F32, F64, BOOL, STR, ARR])
    if kind in (U8, U32, U64):
        return kind, rng.choice([0, 1, 7, 2**(8 if kind == U8 else 32 if kind == U32 else 64) - 1])
    if kind in (I8, I32, I64):
        return kind, rng.choice([-1, 0, 1, -(2**(7 if kind == I8 else 31 if kind == I32 else 63))])
    if kind in (F32, F64):
        return kind, rng.choice([math.nan, math.inf, -math.inf, 0.0, -1.5, 1e30])
    if kind == BOOL:
        return kind, rng.random() < 0.5
    if kind == STR:
        return kind, rng.choice(["", "x", b"\xff\xfe\xfd", "a" * 1000])
    return kind, rng.choice([(I32, [1, -1]), (STR, ["a", "b"]), (F32, [math.nan]), (ARR, [(I32, [1])]), (U8, [])])


def mutate_gguf(rng: random.Random, src: Path, dst: Path) -> str:
    """One mutation of a GGUF file at the level of its fields, tensors or bytes."""
    kvs, tensors = read_gguf(src)
    arch = next(kv.value for kv in kvs if kv.key == "general.architecture")
    r = rng.random()
    if r < 0.45:  # one metadata value
        focus = [k for k in GGUF_FOCUS if any(kv.key in (k, f"{arch}.{k}") for kv in kvs) or k.startswith("tok")]
        if rng.random() < 0.7 and focus:
            short = rng.choice(focus)
            key = short if short.startswith(("tokenizer.", "general.")) else f"{arch}.{short}"
            vtype, value = rng.choice(GGUF_FOCUS[short])
        else:
            key = rng.choice(kvs).key
            vtype, value = _random_kv_value(rng)
        kvs = [kv for kv in kvs if kv.key != key] + [KV(key, vtype, value)]
        what = f"metadata {key} = ({vtype}) {_short(value)}"
    elif r < 0.55:  # a key removed or duplicated
        kv = rng.choice(kvs)
        if rng.random() < 0.5:
            kvs.remove(kv)
            what = f"metadata {kv.key} removed"
        else:
            kvs.append(KV(kv.key, *_random_kv_value(rng)))
            what = f"metadata {kv.key} twice"
    elif r < 0.8:  # tensors
        what = _mutate_tensors(rng, tensors)
    else:
        write_gguf(dst, kvs, tensors)
        return _mutate_bytes(rng, dst)
    write_gguf(dst, kvs, tensors)
    return what


def _mutate_tensors(rng: random.Random, tensors: list[GTensor]) -> str:
    t = rng.choice(tensors)
    r = rng.random()
    if r < 0.15:
        tensors.remove(t)
        return f"tensor {t.name} removed"
    if r < 0.3:
        name = rng.choice(["blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.99.attn_q.weight", "blk.0.unknown.weight",
                           "output.weight", "blk.0.attn_output.bias", "token_embd.weight"])
        tensors.append(GTensor(name, [16], 0, b"\0" * 64))
        return f"extra tensor {name}"
    if r < 0.55:
        dims = list(t.dims)
        i = rng.randrange(len(dims))
        dims[i] = rng.choice([0, 1, dims[i] + 1, dims[i] * 2, 2**40, 2**63])
        if rng.random() < 0.2:
            dims = dims + [1] if rng.random() < 0.5 else dims[:1]
        t.dims = dims
        return f"tensor {t.name} dims {dims}"
    if r < 0.75:
        t.ggml_type = rng.choice([0, 1, 2, 3, 8, 10, 16, 30, 99, 2**31])
        return f"tensor {t.name} type {t.ggml_type}"
    if r < 0.9:
        t.data = t.data[: rng.randrange(max(len(t.data), 1))]
        return f"tensor {t.name} data cut to {len(t.data)} bytes"
    t.name = rng.choice(["", "blk.0", "blk.x.attn_q.weight", "\ud800", "a" * 10_000])
    return f"tensor renamed {_short(t.name)}"


def mutate_raw_bytes(rng: random.Random, path: Path) -> str:
    """A file truncated, or bytes flipped anywhere in it."""
    data = bytearray(path.read_bytes())
    if rng.random() < 0.4:
        cut = rng.randrange(len(data))
        path.write_bytes(bytes(data[:cut]))
        return f"truncated at byte {cut} of {len(data)}"
    n = rng.randint(1, 16)
    for _ in range(n):
        data[rng.randrange(len(data))] = rng.randrange(256)
    path.write_bytes(bytes(data))
    return f"{n} bytes flipped"


def _mutate_bytes(rng: random.Random, path: Path) -> str:
    data = bytearray(path.read_bytes())
    r = rng.random()
    if r < 0.3:
        cut = rng.randrange(len(data))
        path.write_bytes(bytes(data[:cut]))
        return f"truncated at byte {cut} of {len(data)}"
    if r < 0.5:
        at = rng.choice([8, 16])  # the tensor count or the metadata count
        data[at:at + 8] = struct.pack("<Q", rng.choice([2**20, 2**40, 2**63, 0]))
        path.write_bytes(bytes(data))
        return f"header count at byte {at} changed"
    header = min(len(data), 16_000)
    n = rng.randint(1, 16)
    for _ in range(n):
        data[rng.randrange(header)] = rng.randrange(256)
    path.write_bytes(bytes(data))
    return f"{n} header bytes flipped"


# --- KV snapshot files -------------------------------------------------------------------------

def rewrite_snapshot(path: Path, change) -> None:
    """`change(meta, tensors)` applied to a snapshot file, whose token hash and checksum are then
    made to fit: the file's integrity holds and only its contents lie."""
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save_file

    from engine.kv import snapshots
    with safe_open(str(path), "numpy") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    change(meta, tensors)
    if "tokens" in tensors:
        meta["tokens_hash"] = snapshots.token_hash(tensors["tokens"].astype(np.int64).tolist())
    meta["checksum"] = snapshots._checksum(tensors)
    save_file(tensors, str(path), metadata=meta)


# --- safetensors headers -----------------------------------------------------------------------

def read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_safetensors(path: Path, header: dict | str, data: bytes) -> None:
    text = header if isinstance(header, str) else dump(header)
    raw = text.encode("utf-8", "surrogatepass")
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def mutate_safetensors(rng: random.Random, path: Path) -> str:
    header, data = read_safetensors(path)
    names = [n for n in header if n != "__metadata__"]
    name = rng.choice(names)
    r = rng.random()
    if r < 0.2:  # a tensor nothing uses, or a bias without its siblings
        layer = next((n.split(".self_attn")[0] for n in names if ".self_attn.q_proj" in n), "model.layers.0")
        extra = rng.choice([f"{layer}.self_attn.q_proj.bias", f"{layer}.self_attn.o_proj.bias",
                            "model.layers.77.mlp.up_proj.weight", "model.unused.weight", "lm_head.bias",
                            f"{layer}.self_attn.q_norm.weight", f"{layer}.mlp.gate.weight"])
        header[extra] = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
        what = f"header declares {extra}"
    elif r < 0.6:
        what = "header " + mutate_json_value(rng, header[name]) + f" of {name}"
    elif r < 0.7:
        header["__metadata__"] = nasty(rng)
        what = f"__metadata__ = {_short(header['__metadata__'])}"
    elif r < 0.8:
        header.pop(name)
        what = f"tensor {name} removed from the header"
    elif r < 0.9:
        write_safetensors(path, deep_json(rng.choice([1000, 100_000]), "dict"), data)
        return "header nested deep"
    else:
        raw = path.read_bytes()
        cut = rng.randrange(len(raw))
        path.write_bytes(raw[:cut])
        return f"file truncated at {cut}"
    write_safetensors(path, header, data)
    return what
