"""GGML block formats → the engine's tensors: each one an exact `Affine`.

| type | block (elements: bytes)                                     | becomes                                   |
| ---- | ----------------------------------------------------------- | ----------------------------------------- |
| Q4_0 | 32: f16 d, 16 bytes of nibbles (w = d·(q − 8))              | 4-bit g32, scale d, bias −8d              |
| Q4_1 | 32: f16 d, f16 m, 16 bytes of nibbles (w = d·q + m)         | 4-bit g32, scale d, bias m                |
| Q8_0 | 32: f16 d, 32 int8 (w = d·q)                                | 8-bit g32, scale d, bias −128d (q+128)    |
| Q4_K | 256: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins,    | 4-bit g32, fp32 scale d·sc, bias −dmin·m  |
|      | 128 bytes of nibbles (w = d·sc·q − dmin·m per 32)           |                                           |
| Q5_K | 256: as Q4_K plus 32 bytes of fifth bits                    | 8-bit codes 0..31 g32, fp32 scale/bias    |
| Q6_K | 256: 128 bytes of low nibbles, 64 of high pairs, 16 int8    | 8-bit codes 0..63 g16, fp32 scale d·sc,   |
|      | scales, f16 d (w = d·sc·(q − 32) per 16)                    | bias −32·d·sc                             |

Every Affine here reproduces the block's values bit for bit: each product q·scale is exact in fp32
(at most 24 significant bits) and the one rounding is the same addition ggml makes (Q6_K makes none:
q·scale − 32·scale is d·sc·(q − 32) exactly). Q6_K's groups of 16 are narrower than qmv's tiles: the
GPU backend keeps such a linear weight as float32 (its dense path); experts stay 8-bit.
"""
from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

from ..errors import ModelError
from ..weights import Affine, Tensor

QUANTIZED = (QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K)
SUPPORTED = (QT.F32, QT.F16, QT.BF16, *QUANTIZED)
K_BLOCK = 256


def block_shape(kind: QT) -> tuple[int, int]:
    """(elements, bytes) of one block."""
    return GGML_QUANT_SIZES[kind]


def decode(kind: QT, data: np.ndarray, shape: tuple[int, ...], where: str) -> Tensor:
    """The stored blocks of a [..., out, in] tensor as an Affine.
    `data` is the tensor's raw bytes; its size must match the shape exactly."""
    elements, nbytes = block_shape(kind)
    n_in = shape[-1]
    rows = int(np.prod(shape[:-1]))
    raw = np.asarray(data)
    if len(shape) < 2 or n_in % elements or raw.nbytes != rows * (n_in // elements) * nbytes:
        raise ModelError(f"{where} is {kind.name} but has shape {list(shape)} ({raw.nbytes} bytes; {kind.name} "
                         f"stores blocks of {elements} values in {nbytes} bytes along the last dimension)")
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, n_in // elements, nbytes)
    w = {QT.Q4_0: q4_0, QT.Q4_1: q4_1, QT.Q8_0: q8_0, QT.Q4_K: q4_k, QT.Q5_K: q5_k, QT.Q6_K: q6_k}[kind](b)
    rows_shape = shape[:-1]  # stacked experts: [E, out] rows
    return Affine(w.packed.reshape(*rows_shape, -1), w.scales.reshape(*rows_shape, -1),
                  w.biases.reshape(*rows_shape, -1), w.bits, w.group)


# --- helpers ---------------------------------------------------------------------------------------

def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte `at` of every block."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0]


def _pack4(codes: np.ndarray) -> np.ndarray:
    """4-bit codes [rows, n] in element order → MLX words: byte i holds elements 2i (low) and 2i+1."""
    rows = codes.shape[0]
    return np.ascontiguousarray(codes[:, 0::2] | (codes[:, 1::2] << 4)).view("<u4").reshape(rows, -1)


def _pack8(codes: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(codes).view("<u4").reshape(codes.shape[0], -1)


def _nibbles(qs: np.ndarray, chunk: int) -> np.ndarray:
    """ggml's nibble runs: each `chunk` bytes hold elements 0..chunk-1 (low nibbles) then chunk..2chunk-1."""
    rows, blocks, n = qs.shape
    q = qs.reshape(rows, blocks, n // chunk, 1, chunk) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    return (q & 0x0F).reshape(rows, blocks, 2 * n)


def _fp16_or_fp32(scales: np.ndarray, biases32: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp16 scales with biases that are exact multiples of them: fp16 both, unless a bias overflows fp16."""
    with np.errstate(over="ignore"):
        biases = biases32.astype(np.float16)
    if np.isfinite(biases).all() or not np.isfinite(biases32).all():
        return scales, biases
    return scales.astype(np.float32), biases32


# --- the 32-element formats ------------------------------------------------------------------------

def q4_0(b: np.ndarray) -> Affine:
    d = _f16(b, 0)
    codes = _nibbles(b[..., 2:], 16).reshape(b.shape[0], -1)
    scales, biases = _fp16_or_fp32(d, d.astype(np.float32) * np.float32(-8))
    return Affine(_pack4(codes), scales, biases, bits=4, group=32)


def q4_1(b: np.ndarray) -> Affine:
    codes = _nibbles(b[..., 4:], 16).reshape(b.shape[0], -1)
    return Affine(_pack4(codes), _f16(b, 0), _f16(b, 2), bits=4, group=32)


def q8_0(b: np.ndarray) -> Affine:
    # w = d·q = d·(q+128) − 128·d, and q+128 as a byte is q's byte xor 0x80
    d = _f16(b, 0)
    scales, biases = _fp16_or_fp32(d, d.astype(np.float32) * np.float32(-128))
    return Affine(_pack8((b[..., 2:] ^ 0x80).reshape(b.shape[0], -1)), scales, biases, bits=8, group=32)


# --- K-quants --------------------------------------------------------------------------------------

def _scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes → 8 six-bit scales and 8 six-bit mins per super-block.
    Bytes 0..3 hold scales 0..3 (low 6 bits), 4..7 mins 0..3, 8..11 the low nibbles of scales 4..7
    and mins 4..7 (high nibble); the top 2 bits of bytes 0..7 are the high bits of scales/mins 4..7."""
    s = packed.reshape(*packed.shape[:-1], 3, 4)
    lo, mid, hi = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return sc, mn


def _k_affine(b: np.ndarray, codes: np.ndarray, bits: int) -> Affine:
    rows = b.shape[0]
    d, dmin = _f16(b, 0).astype(np.float32), _f16(b, 2).astype(np.float32)
    sc, mn = _scales_mins(b[..., 4:16])
    scales = (d[..., None] * sc.astype(np.float32)).reshape(rows, -1)
    biases = -(dmin[..., None] * mn.astype(np.float32)).reshape(rows, -1)
    codes = codes.reshape(rows, -1)
    return Affine(_pack4(codes) if bits == 4 else _pack8(codes), scales, biases, bits=bits, group=32)


def q4_k(b: np.ndarray) -> Affine:
    return _k_affine(b, _nibbles(b[..., 16:144], 32), bits=4)


def q5_k(b: np.ndarray) -> Affine:
    rows, blocks = b.shape[:2]
    low = _nibbles(b[..., 48:176], 32)
    qh = b[..., 16:48].reshape(rows, blocks, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    high = (qh & 1).reshape(rows, blocks, K_BLOCK)  # sub-block j takes bit j of each of the 32 bytes
    return _k_affine(b, low | (high << 4), bits=8)


def q6_k(b: np.ndarray) -> Affine:
    """Q6_K: (d·sc)·(q − 32) per 16 elements = scale·q + bias with scale d·sc (fp32: 18 bits at most)."""
    rows, blocks = b.shape[:2]
    low = _nibbles(b[..., :128], 64)  # [rows, blocks, 256]: 128-element halves, each 64 bytes
    qh = b[..., 128:192].reshape(rows, blocks, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
    high = (qh & 3).reshape(rows, blocks, K_BLOCK)
    codes = (low | (high << 4)).reshape(rows, -1)
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)
    scales = (_f16(b, 208).astype(np.float32)[..., None] * sc).reshape(rows, -1)
    return Affine(_pack8(codes), scales, scales * np.float32(-32), bits=8, group=16)
