"""GGML block formats (engine.loader.gguf_blocks): every type against the `gguf` package's own
dequantization, bit for bit, in the Affine layout each one maps onto; on the GPU, the same weights
prepared by the CuPy backend (marked gpu)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from engine.errors import ModelError
from engine.loader.gguf_blocks import QUANTIZED, decode
from engine.ops import cuda_available
from engine.weights import Affine, dequantize

import ckpt_gguf

QT = gguf.GGMLQuantizationType
LAYOUT = {"Q4_0": (4, 32), "Q4_1": (4, 32), "Q8_0": (8, 32), "Q4_K": (4, 32), "Q5_K": (8, 32), "Q6_K": (8, 16)}
OK, WHY = cuda_available()


def weights(rows: int = 24, n: int = 512, seed: int = 0, lead: tuple[int, ...] = ()) -> np.ndarray:
    """Rows of very different scales and offsets, so every field of a block is exercised."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((*lead, rows, n)).astype(np.float32)
    return w * rng.uniform(0.01, 3, (*lead, rows, 1)).astype(np.float32) + rng.uniform(-1, 1, (*lead, rows, 1))


def random_blocks(kind: QT, rows: int, n: int, seed: int) -> np.ndarray:
    """Blocks of random bytes (every scale, min and code pattern) with finite fp16 fields."""
    elements, size = gguf.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (rows, n // elements, size), dtype=np.uint8)
    f16 = {QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q8_0: [0], QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208]}[kind]
    for at in f16:
        b[..., at:at + 2] = rng.uniform(-2, 2, b.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
    return b.reshape(rows, -1)


@pytest.mark.parametrize("name", list(LAYOUT))
def test_written_blocks_equal_gguf_dequantize(name: str) -> None:
    w = weights()
    data, reference = ckpt_gguf.encode(w, name)
    t = decode(QT[name], data, w.shape, "t")
    assert isinstance(t, Affine) and (t.bits, t.group) == LAYOUT[name]
    np.testing.assert_array_equal(dequantize(t), reference)
    assert np.abs(reference - w).max() < 0.25 * np.abs(w).max()  # the encoders here really quantize


@pytest.mark.parametrize("kind", QUANTIZED, ids=lambda k: k.name)
def test_random_block_bytes_equal_gguf_dequantize(kind: QT) -> None:
    """Any block the format can hold, not only what an encoder writes."""
    for seed in range(3):
        data = random_blocks(kind, 8, 512, seed)
        np.testing.assert_array_equal(dequantize(decode(kind, data, (8, 512), "t")),
                                      gguf.quants.dequantize(data, kind))


@pytest.mark.parametrize("name", list(LAYOUT))
def test_stacked_expert_tensors(name: str) -> None:
    w = weights(rows=8, n=256, lead=(3,))
    data, reference = ckpt_gguf.encode(w, name)
    t = decode(QT[name], data, w.shape, "t")
    assert t.shape == w.shape
    np.testing.assert_array_equal(dequantize(t), reference)


def test_fp16_scale_whose_bias_overflows_becomes_fp32() -> None:
    """Q8_0's bias is −128·d: for d above 511.75 it no longer fits fp16, and exactness needs fp32."""
    w = np.full((2, 32), 70000.0, np.float32)  # d = 70000/127 ≈ 551
    w[1] = np.linspace(-1, 1, 32)
    data, reference = ckpt_gguf.encode(w, "Q8_0")
    t = decode(QT.Q8_0, data, w.shape, "t")
    assert t.scales.dtype == np.float32 and t.biases.dtype == np.float32
    np.testing.assert_array_equal(dequantize(t), reference)
    small = decode(QT.Q8_0, ckpt_gguf.encode(w[1:], "Q8_0")[0], (1, 32), "t")
    assert small.scales.dtype == np.float16  # the common case stays fp16 (half the scale bytes)


@pytest.mark.parametrize("name, shape, nbytes", [("Q4_K", (4, 300), None), ("Q6_K", (4, 256), 100),
                                                 ("Q8_0", (4, 64), 3), ("Q4_0", (64,), None)])
def test_a_shape_that_does_not_fit_the_blocks_is_refused(name: str, shape, nbytes) -> None:
    data = np.zeros(nbytes if nbytes else 4 * 144, np.uint8)
    with pytest.raises(ModelError, match=rf"t is {name} but has shape"):
        decode(QT[name], data, shape, "t")


# --- the GPU: the same weights prepared by the CuPy backend ---------------------------------------

def gpu_test(f):
    return pytest.mark.gpu(pytest.mark.skipif(not OK, reason=WHY or "no GPU")(f))


@gpu_test
@pytest.mark.parametrize("name", list(LAYOUT))
def test_cupy_weights_equal_gguf_dequantize(name: str) -> None:
    """Each type as the GPU keeps it (qmv's tile layout, or float32 for Q6_K's groups of 16)
    dequantizes to gguf's values, and its product matches the float64 product of those values."""
    import cupy

    from engine.ops.cupy_backend import CupyBackend
    from engine.ops.cupy_weights import DenseWeight, QWeight
    b = CupyBackend()
    w = weights(rows=96, n=512, seed=4)
    data, reference = ckpt_gguf.encode(w, name)
    prepared = b.prepare(decode(QT[name], data, w.shape, "t"))
    assert isinstance(prepared, DenseWeight if name == "Q6_K" else QWeight)
    np.testing.assert_array_equal(cupy.asnumpy(prepared.dequantize()), reference)
    x = np.random.default_rng(5).standard_normal((3, 512)).astype(np.float32)
    got = cupy.asnumpy(b.linear(cupy.asarray(x), prepared))
    want = x.astype(np.float64) @ reference.T.astype(np.float64)
    assert np.linalg.norm(got - want) <= 1e-4 * np.linalg.norm(want)


@gpu_test
@pytest.mark.parametrize("name", list(LAYOUT))
def test_cupy_expert_weights_equal_gguf_dequantize(name: str) -> None:
    import cupy

    from engine.ops.cupy_backend import CupyBackend
    b = CupyBackend()
    w = weights(rows=64, n=256, seed=6, lead=(4,))
    data, reference = ckpt_gguf.encode(w, name)
    prepared = b.prepare(decode(QT[name], data, w.shape, "t"), "experts")
    assert not isinstance(prepared, cupy.ndarray)  # every type stays quantized as experts
    got = prepared.dequantize() if hasattr(prepared, "dequantize") else prepared
    np.testing.assert_array_equal(cupy.asnumpy(got), reference)
