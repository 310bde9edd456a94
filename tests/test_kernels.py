"""Contract tests: every CuPy kernel against its numpy twin (engine/ops/numpy_backend.py), on the device.

Shapes include odd sizes (rows not a multiple of the 16-row tile, inputs not a multiple of 128), one
row and many rows, and positions on both sides of page and 256-key chunk boundaries. Tolerances:
bit-exact where the kernel promises numpy's rounding (embedding, KV bits, argmax, sampling); 1e-6
relative for norms and RoPE (different summation order, the same formulas); 5e-5 relative to the
row's norm for the 4-bit products (x split into two bf16 halves: 2^-18 per element), 1e-4 for 8-bit;
2e-5 for attention (fp32 softmax in chunks).
"""
import numpy as np
import pytest

from engine.kv import Cache
from engine.kv.cache import encode_kv
from engine.ops import cuda_available
from engine.ops.numpy_backend import NumpyBackend
from engine.settings import SamplingParams
from engine.weights import Affine, dequantize, quantize

OK, WHY = cuda_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not OK, reason=WHY or "no GPU")]

if OK:
    import cupy

    from engine.ops.cupy_lazy import Heads

GB_GRAPHS = True  # conftest's gb: decode steps replay captured graphs
NB = NumpyBackend()


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def rand_affine(rng, M, K, bits, group, sdtype):
    w = rng.normal(0, K ** -0.5, (M, K))
    q = quantize(w, bits, group, np.float32)
    if sdtype != "float32":
        import ml_dtypes
        dt = ml_dtypes.bfloat16 if sdtype == "bfloat16" else np.float16
        q = Affine(q.packed, q.scales.astype(dt), q.biases.astype(dt), bits, group)
    return q


# --- quantized and dense products ---------------------------------------------------------------
@pytest.mark.parametrize("bits,group,sdtype", [(4, 32, "float16"), (4, 64, "float16"), (4, 128, "bfloat16"),
                                               (4, 64, "float32"), (8, 32, "bfloat16"), (8, 64, "float16"),
                                               (8, 128, "float32")])
@pytest.mark.parametrize("M,K", [(48, 384), (100, 640)])
def test_qmv_matches_dequantized_product(gb, bits, group, sdtype, M, K):
    rng = np.random.default_rng(bits * 1000 + group + M)
    w = rand_affine(rng, M, K, bits, group, sdtype)
    W = dequantize(w).astype(np.float64)
    qw = gb.prepare(w)
    for n in (1, 3, 8, 9, 17, 33, 128):
        x = rng.normal(0, 1, (n, K)).astype(np.float32)
        y = gb.to_host(gb.linear(gb.asarray(x), qw))
        ref = x.astype(np.float64) @ W.T
        assert y.shape == (n, M)
        tol = 5e-5 if bits == 4 else 1e-4  # 8-bit: two nibble products, a larger offset to cancel
        for i in range(n):
            assert rel(y[i], ref[i]) < tol, (n, i, rel(y[i], ref[i]))
    # every row alone gives the same bits as in any batch (the decode invariance)
    x = rng.normal(0, 1, (20, K)).astype(np.float32)
    full = gb.to_host(gb.linear(gb.asarray(x), qw))
    for i in (0, 7, 8, 19):
        one = gb.to_host(gb.linear(gb.asarray(x[i:i + 1]), qw))
        assert np.array_equal(one[0], full[i])
    assert np.array_equal(gb.to_host(gb.linear(gb.asarray(x[5:13]), qw)), full[5:13])
    # the repacked layout dequantizes back to numpy's weights exactly
    assert np.array_equal(gb.to_host(qw.dequantize()), dequantize(w))


def qmv_schedules(gb, seed: int, M: int, K: int, xm: int, rows: tuple, schedules: list[dict]) -> None:
    """One random 4-bit product in input mode xm run under each launcher schedule (keyword arguments of
    kernels.launch.qmv): every output bit, and h = x + x2 (xm 2), the same under all of them."""
    import kernels.launch as KL
    rng = np.random.default_rng(seed)
    qw = gb.prepare(rand_affine(rng, M, K, 4, 64, "float16"))
    nw = cupy.asarray(rng.uniform(0.5, 1.5, K).astype(np.float32))
    for n in rows:
        x = cupy.asarray(rng.normal(0, 1, (n, K)).astype(np.float32))
        x2 = cupy.asarray(rng.normal(0, 1, (n, K)).astype(np.float32))
        out = []
        for kw in schedules:
            y, h = cupy.zeros((n, M), cupy.float32), cupy.zeros((n, K), cupy.float32)
            KL.qmv(qw.codes, qw.sb, qw.st, 4, 64, M, K, x, K, y, n, xm=xm, x2=x2 if xm else None,
                   ldx2=K if xm else 0, nw=nw if xm == 2 else None, eps=1e-5, hout=h if xm == 2 else None,
                   ldh=K, **kw)
            out.append((cupy.asnumpy(y), cupy.asnumpy(h)))
        assert np.abs(out[0][0]).sum() > 0
        for y, h in out[1:]:
            assert np.array_equal(y, out[0][0]) and np.array_equal(h, out[0][1])
        if xm == 2:
            assert np.array_equal(out[0][1], cupy.asnumpy(x + x2))


@pytest.mark.parametrize("xm", [0, 1, 2])
def test_qmv_blocks_an_sm_change_no_bits(gb, xm):
    """The 2- and 3-blocks-an-SM builds of one product (the launcher picks by waves) agree bit for bit,
    in every input mode and for the packed rows and one n-tile."""
    qmv_schedules(gb, 11 + xm, 300, 2560, xm, (1, 4, 8), [dict(min_blocks=2), dict(min_blocks=3)])


@pytest.mark.parametrize("xm", [0, 1, 2])
@pytest.mark.parametrize("M, K", [(300, 2560), (64, 5120)])  # one segment; segments of a split K
def test_qmv_split_x_changes_no_bits(gb, xm, M, K):
    """x split once for all blocks (qmv_xsplit) and x staged by every block give the same bits, for
    packed rows, one and two n-tiles and K not a whole number of split blocks."""
    qmv_schedules(gb, 21 + xm, M, K, xm, (3, 8, 13), [dict(split_x=False), dict(split_x=True)])


@pytest.mark.parametrize("M1", [640, 1024])  # the next product's K: padded pieces past it, or none
def test_qmv_split_out_equals_the_split_kernel(gb, M1):
    """A product in K segments writing the next product's input split (split_out: rmsnorm(y + res) * nw
    with h = y + res) gives qmv_xsplit's pieces, sums and h bit for bit, and the same outputs of both."""
    import kernels.launch as KL
    rng = np.random.default_rng(M1)
    K1, M2 = 4096, 300
    assert KL.qmv_split(M1, K1)[1] > 1
    w1, w2 = (gb.prepare(rand_affine(rng, m, k, 4, 64, "float16")) for m, k in ((M1, K1), (M2, M1)))
    nw = cupy.asarray(rng.uniform(0.5, 1.5, M1).astype(np.float32))
    for n in (4, 5, 8, 13, 16):
        assert KL.qmv_splits_out(n, M1, K1, 64, 64)
        x = cupy.asarray(rng.normal(0, 1, (n, K1)).astype(np.float32))
        res = cupy.asarray(rng.normal(0, 1, (n, M1)).astype(np.float32))
        ya, yb = cupy.zeros((n, M1), cupy.float32), cupy.zeros((n, M1), cupy.float32)
        ha, hb = cupy.zeros((n, M1), cupy.float32), cupy.zeros((n, M1), cupy.float32)
        KL.qmv(w1.codes, w1.sb, w1.st, 4, 64, M1, K1, x, K1, ya, n)
        pa = KL.qmv_xsplit(ya, M1, n, M1, 64, 2, res, M1, nw, ha, M1)
        pb = KL.xsplit_buffers(n, M1, 64, 2)
        for a in pb:
            a.fill(7)  # every word written, padding included
        KL.qmv(w1.codes, w1.sb, w1.st, 4, 64, M1, K1, x, K1, yb, n, split_out=(pb, res, M1, nw, hb, M1))
        assert np.array_equal(cupy.asnumpy(ya), cupy.asnumpy(yb))
        assert np.array_equal(cupy.asnumpy(ha), cupy.asnumpy(hb)) and np.array_equal(cupy.asnumpy(hb),
                                                                                       cupy.asnumpy(ya + res))
        for a, b in zip(pa, pb):
            assert np.array_equal(cupy.asnumpy(a), cupy.asnumpy(b))
        za, zb = cupy.zeros((n, M2), cupy.float32), cupy.zeros((n, M2), cupy.float32)
        KL.qmv(w2.codes, w2.sb, w2.st, 4, 64, M2, M1, ya, M1, za, n, xm=2, x2=res, ldx2=M1, nw=nw, eps=1e-5)
        KL.qmv(w2.codes, w2.sb, w2.st, 4, 64, M2, M1, yb, M1, zb, n, xm=2, x2=res, ldx2=M1, nw=nw, eps=1e-5,
               pieces=pb)
        assert np.array_equal(cupy.asnumpy(za), cupy.asnumpy(zb))
    with pytest.raises(ValueError, match="cannot split its output"):
        KL.qmv(w1.codes, w1.sb, w1.st, 4, 64, M1, K1, x[:2], K1, ya[:2], 2, split_out=(pb, res, M1, nw, hb, M1))


def test_a_product_feeding_a_norm_writes_the_next_products_split_input(gb):
    """linear(feeds_norm) of 4-16 rows is a Product; a norm-staged product that splits its input once
    runs it with split_out: the same outputs and residual as the plain launches."""
    import kernels
    import kernels.launch as KL
    from engine.ops.cupy_lazy import Product
    rng = np.random.default_rng(5)
    H, K1, M2 = 4096, 1024, 24576
    assert KL.qmv_splits_x(8, M2, H, 2)
    w1, w2 = (gb.prepare(rand_affine(rng, m, k, 4, 64, "bfloat16")) for m, k in ((H, K1), (M2, H)))
    nw = rng.uniform(0.5, 1.5, H).astype(np.float32)
    x = gb.asarray(rng.normal(0, 1, (8, K1)).astype(np.float32))
    res = gb.asarray(rng.normal(0, 1, (8, H)).astype(np.float32))
    out = []
    for feeds in (False, True):
        with kernels.timing() as t:
            p = gb.linear(x, w1, feeds_norm=feeds)
            assert isinstance(p, Product) == feeds and not (feeds and p.launched)
            h, r = gb.add_rmsnorm(p, res, gb.asarray(nw), 1e-5)
            z = gb.linear(h, w2)
        split = [name.startswith("qmv_xsplit") for name, _, _ in t.rows()]
        assert split == ([False, False] if feeds else [False, True, False])  # one launch fewer
        out.append((gb.to_host(z), gb.to_host(r), gb.to_host(p)))
    for a, b in zip(*out):
        assert np.array_equal(a, b)
    assert np.array_equal(out[1][1], out[1][2] + gb.to_host(res))
    one = gb.linear(x[:1], w1, feeds_norm=True)  # one row: launched at once (no split to write)
    assert not isinstance(one, Product)


def test_qmv_odd_input_width_and_lazy_silu(gb):
    rng = np.random.default_rng(3)
    w = rand_affine(rng, 40, 96, 4, 32, "float16")  # three subgroups: a padded pair in the 4-bit layout
    W = dequantize(w).astype(np.float64)
    qw = gb.prepare(w)
    gu = rng.normal(0, 2, (5, 192)).astype(np.float32)
    g, u = gb.asarray(gu)[:, :96], gb.asarray(gu)[:, 96:]
    y = gb.to_host(gb.linear(gb.silu_mul(g, u), qw))  # SiLU computed as the product stages its input
    act = NB.silu_mul(gu[:, :96], gu[:, 96:])
    assert rel(y, act.astype(np.float64) @ W.T) < 5e-5
    # the fused product equals the one over the materialised activation bit for bit
    assert np.array_equal(y, gb.to_host(gb.linear(gb.silu_mul(g, u).materialize(), qw)))
    assert np.allclose(gb.to_host(gb.silu_mul(g, u)), act, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bits,group", [(4, 64), (8, 32)])  # 8-bit in groups of 32: the routers' format
@pytest.mark.parametrize("M,K", [(256, 4096), (200, 1536), (64, 2048)])
def test_qmv_segments_and_fused_rmsnorm(gb, M, K, bits, group):
    """K in several segments (partials added in order by the last block), with the RMSNorm of
    x + residual folded into the product; h = x + residual written once, exactly. Up to 40 rows:
    every n-tile build, whose batches must hold whole 64-input pieces of a row's sum of squares."""
    import kernels.launch as KL
    assert KL.qmv_split(M, K)[1] > 1
    rng = np.random.default_rng(M + K)
    w = rand_affine(rng, M, K, bits, group, "float16")
    W = dequantize(w).astype(np.float64)
    qw = gb.prepare(w)
    nw = rng.uniform(0.5, 1.5, K).astype(np.float32)
    for n in (1, 8, 12, 40):
        x = rng.normal(0, 1, (n, K)).astype(np.float32)
        r = rng.normal(0, 3, (n, K)).astype(np.float32)
        y = gb.to_host(gb.linear(gb.asarray(x), qw))
        assert rel(y, x.astype(np.float64) @ W.T) < 5e-5
        normed, resid = gb.add_rmsnorm(gb.asarray(x), gb.asarray(r), gb.asarray(nw), 1e-5)
        yn = gb.to_host(gb.linear(normed, qw))
        h = x.astype(np.float64) + r
        ref = (h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-5) * nw) @ W.T
        for i in range(n):
            assert rel(yn[i], ref[i]) < 5e-5, (n, i)
        assert np.array_equal(gb.to_host(resid), x + r)
        # without a residual: the first layer's norm
        y0 = gb.to_host(gb.linear(gb.rmsnorm(gb.asarray(x), gb.asarray(nw), 1e-5), qw))
        ref0 = (x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * nw) @ W.T
        assert rel(y0, ref0) < 5e-5
    # a row's bits do not depend on its company, in every mode
    x = rng.normal(0, 1, (20, K)).astype(np.float32)
    r = rng.normal(0, 1, (20, K)).astype(np.float32)

    def run(a, b):
        nm, _ = gb.add_rmsnorm(gb.asarray(a), gb.asarray(b), gb.asarray(nw), 1e-5)
        return gb.to_host(gb.linear(nm, qw))

    full = run(x, r)
    for i in (0, 9, 19):
        assert np.array_equal(run(x[i:i + 1], r[i:i + 1])[0], full[i])
    assert np.array_equal(run(x[3:11], r[3:11]), full[3:11])


@pytest.fixture(params=["qgemm", "cublas"])
def prompt_gemm(gb, request):
    """Both paths of fp16 prompt products on any GPU (the backend picks one by the device)."""
    old, gb.prompt_gemm = gb.prompt_gemm, request.param
    yield request.param
    gb.prompt_gemm = old


@pytest.mark.parametrize("group,sdtype", [(32, "float16"), (64, "bfloat16"), (128, "float32"), (64, "float16")])
@pytest.mark.parametrize("M,K,chunk", [(100, 640, 128), (300, 4096, 128), (4096, 1536, 512)])
def test_prompt_products_on_tensor_cores(gb, prompt_gemm, group, sdtype, M, K, chunk):
    """fp16 prompt products (qgemm; cuBLAS over a dequantized copy from CUBLAS_MIN_ROWS rows): fp16
    inputs and weights, so ~2^-11 an element; every input mode. qgemm: a row's bits depend on the row
    alone (rows in other blocks), segments (qgemm_split > 1) added in order. cuBLAS: on the row and
    the row count (never on other rows' values), the same bits call after call. Exact prompt
    products stay qmv's."""
    import kernels.launch as KL
    rng = np.random.default_rng(group + M + K)
    w = rand_affine(rng, M, K, 4, group, sdtype)
    W = dequantize(w).astype(np.float64)
    qw = gb.prepare(w)
    nw = rng.uniform(0.5, 1.5, K).astype(np.float32)
    tol = 2e-3
    big = chunk if prompt_gemm == "qgemm" else max(chunk, KL.CUBLAS_MIN_ROWS)  # rows that take the path
    for n in (1, 37, big):
        x = (rng.normal(0, 1, (n, K)) * rng.uniform(0.01, 100, (n, 1))).astype(np.float32)
        r = rng.normal(0, 3, (n, K)).astype(np.float32)
        y = gb.to_host(gb.linear(gb.asarray(x), qw, chunk, True))
        ref = x.astype(np.float64) @ W.T
        assert y.shape == (n, M)
        for i in range(n):
            assert rel(y[i], ref[i]) < tol, (n, i, rel(y[i], ref[i]))
        normed, resid = gb.add_rmsnorm(gb.asarray(x), gb.asarray(r), gb.asarray(nw), 1e-5)
        yn = gb.to_host(gb.linear(normed, qw, chunk, True))
        h = x.astype(np.float64) + r
        refn = (h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-5) * nw) @ W.T
        assert max(rel(yn[i], refn[i]) for i in range(n)) < tol
        assert np.array_equal(gb.to_host(resid), x + r)  # h written once by the product's staging
        g, u = gb.asarray(x), gb.asarray(r)
        ys = gb.to_host(gb.linear(gb.silu_mul(g, u), qw, chunk, True))
        refs = NB.silu_mul(x, r).astype(np.float64) @ W.T
        assert max(rel(ys[i], refs[i]) for i in range(n)) < tol
    x = rng.normal(0, 1, (big, K)).astype(np.float32)
    full = gb.to_host(gb.linear(gb.asarray(x), qw, chunk, True))
    if prompt_gemm == "qgemm":  # a row alone, and rows at other offsets, give the bits they have in the chunk
        for i in (0, 63, chunk - 1):
            assert np.array_equal(gb.to_host(gb.linear(gb.asarray(x[i:i + 1]), qw, chunk, True))[0], full[i])
        assert np.array_equal(gb.to_host(gb.linear(gb.asarray(x[5:90]), qw, chunk, True)), full[5:90])
    else:  # other rows' values never reach a row; the same chunk gives the same bits
        other = x.copy()
        other[1::2] = rng.normal(0, 50, other[1::2].shape)
        again = gb.to_host(gb.linear(gb.asarray(other), qw, chunk, True))
        assert np.array_equal(again[0::2], full[0::2])
        assert np.array_equal(gb.to_host(gb.linear(gb.asarray(x), qw, chunk, True)), full)
    if (M, K) == (300, 4096):
        assert KL.qgemm_split(M, K, chunk)[1] > 1
    x = rng.normal(0, 1, (9, K)).astype(np.float32)
    assert np.array_equal(gb.to_host(gb.linear(gb.asarray(x), qw, chunk)), gb.to_host(gb.linear(gb.asarray(x), qw)))


@pytest.mark.parametrize("group,sdtype", [(32, "float16"), (64, "bfloat16"), (128, "float32")])
def test_prompt_weight_copy_rounds_as_qgemm(gb, group, sdtype):
    """qgemm_dequant, the cuBLAS path's fp16 weights: each s * q + b rounded once to fp16 (the scale
    and bias first to fp16), rows of padded_subgroups(K) * 32 with zeros past K."""
    import kernels.launch as KL
    rng = np.random.default_rng(group)
    M, K = 100, 640
    w = rand_affine(rng, M, K, 4, group, sdtype)
    qw = gb.prepare(w)
    Kp = KL.padded_subgroups(K) * 32
    out = cupy.full(M * Kp, 0xFFFF, cupy.uint16)
    KL.qgemm_dequant(qw.codes, qw.sb, qw.st, group, M, K, out)
    got = gb.to_host(out).view(np.float16).reshape(M, Kp)
    k = np.arange(K)
    q = ((w.packed[:, k // 8] >> (4 * (k % 8)).astype(np.uint32)) & 15).astype(np.float64)  # MLX: input j, nibble j
    s16 = np.repeat(w.scales.astype(np.float32).astype(np.float16), group, 1).astype(np.float64)
    b16 = np.repeat(w.biases.astype(np.float32).astype(np.float16), group, 1).astype(np.float64)
    assert np.array_equal(got[:, :K].view(np.uint16), (s16 * q + b16).astype(np.float16).view(np.uint16))
    assert not got[:, K:].any()


def test_dense_gemv(gb):
    rng = np.random.default_rng(4)
    W = rng.normal(0, 0.1, (37, 70)).astype(np.float32)
    dw = gb.prepare(W)
    x = rng.normal(0, 1, (6, 70)).astype(np.float32)
    y = gb.to_host(gb.linear(gb.asarray(x), dw))
    assert rel(y, x.astype(np.float64) @ W.T.astype(np.float64)) < 1e-6
    one = gb.to_host(gb.linear(gb.asarray(x[2:3]), dw))
    assert np.array_equal(one[0], y[2])


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 64), (4, 128)])
def test_embedding_gather_is_exact(gb, bits, group):
    rng = np.random.default_rng(5)
    w = rand_affine(rng, 50, 256, bits, group, "float16")
    t = gb.prepare(w, "embed")
    ids = np.array([0, 49, 17, 17, 31], np.int32)
    assert np.array_equal(gb.to_host(gb.embed(t, gb.asarray(ids))), NB.embed(NB.prepare(w, "embed"), ids))


# --- norms, activations, RoPE -----------------------------------------------------------------------
def test_rmsnorm_and_add_rmsnorm(gb):
    rng = np.random.default_rng(6)
    for H in (64, 576, 4096, 1000):
        x = rng.normal(0, 3, (5, H)).astype(np.float32)
        r = rng.normal(0, 3, (5, H)).astype(np.float32)
        w = rng.uniform(0.5, 1.5, H).astype(np.float32)
        y = gb.to_host(gb.rmsnorm(gb.asarray(x), gb.prepare(w, "norm"), 1e-5))
        assert np.allclose(y, NB.rmsnorm(x, w, 1e-5), rtol=2e-6, atol=1e-6)
        y2, h2 = gb.add_rmsnorm(gb.asarray(x), gb.asarray(r), gb.prepare(w, "norm"), 1e-6)
        ry, rh = NB.add_rmsnorm(x, r, w, 1e-6)
        assert np.array_equal(gb.to_host(h2), rh)
        assert np.allclose(gb.to_host(y2), ry, rtol=2e-6, atol=1e-6)


def test_sigmoid_mul(gb):
    rng = np.random.default_rng(7)
    x, g = rng.normal(0, 2, (4, 33)).astype(np.float32), rng.normal(0, 2, (4, 33)).astype(np.float32)
    assert np.allclose(gb.to_host(gb.sigmoid_mul(gb.asarray(x), gb.asarray(g))), NB.sigmoid_mul(x, g),
                       rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("D,rot,theta", [(64, 64, 1e4), (128, 128, 5e5), (256, 64, 1e7)])
def test_rope_and_qk_norm_on_strided_heads(gb, D, rot, theta):
    rng = np.random.default_rng(D)
    n, heads = 7, 3
    wide = rng.normal(0, 1, (n, heads * D + 40)).astype(np.float32)  # a slice of a fused projection
    x_np = wide[:, 8:8 + heads * D].reshape(n, heads, D)
    x = gb.asarray(wide)[:, 8:8 + heads * D].reshape(n, heads, D)
    pos = np.array([0, 1, 255, 256, 4095, 70000, 131071], np.int32)
    r = gb.rope(x, gb.asarray(pos), theta, rot)
    assert isinstance(r, Heads)
    assert np.allclose(gb.to_host(r), NB.rope(x_np, pos, theta, rot), rtol=1e-6, atol=2e-6)
    nw = rng.uniform(0.5, 1.5, D).astype(np.float32)
    qn = gb.rope(gb.rmsnorm(x, gb.prepare(nw, "norm"), 1e-6), gb.asarray(pos), theta, rot)
    ref = NB.rope(NB.rmsnorm(x_np, nw, 1e-6), pos, theta, rot)
    assert np.allclose(gb.to_host(qn), ref, rtol=1e-5, atol=2e-6)


def test_rope_table_is_numpys_cos_and_sin_made_once_a_forward(gb):
    """The (cos, sin) pairs every kernel applies are numpy's float64 angle and functions rounded to
    float once; one table serves every q and k of a forward on the same positions, and the next
    forward (it starts with an embedding) makes its own."""
    theta, rot = 5e5, 128
    pos = np.concatenate([np.arange(0, 40000, 7), [131071]]).astype(np.int32)
    x = gb.asarray(np.zeros((len(pos), 1, rot), np.float32))
    r1, r2 = gb.rope(x, pos, theta, rot), gb.rope(x, pos, theta, rot)
    assert r1.cs is r2.cs
    half = rot // 2
    ang = pos.astype(np.float64)[:, None] * (1.0 / (theta ** (np.arange(half, dtype=np.float64) * 2.0 / rot)))
    cs = gb.to_host(r1.cs)
    for got, want in ((cs[..., 0], np.cos(ang).astype(np.float32)), (cs[..., 1], np.sin(ang).astype(np.float32))):
        ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
        assert ulps.max() <= 1 and (ulps == 0).mean() > 0.9999  # float64 libraries may differ in a last bit
    table = gb.prepare(rand_affine(np.random.default_rng(0), 4, 256, 4, 64, "float16"), "embed")
    gb.embed(table, np.array([1], np.int32))
    assert gb.rope(x, pos, theta, rot).cs is not r1.cs


# --- KV cache and attention ---------------------------------------------------------------------------
def caches(gb, dtype, pages=40, pt=16, kvh=3, D=64, layers=1):
    return tuple(Cache(b, layers=layers, pages=pages, page_tokens=pt, kv_heads=kvh, head_dim=D, kv_dtype=dtype, lanes=1)
                 for b in (NB, gb))


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_kv_write_bits_match_encode_kv(gb, dtype):
    rng = np.random.default_rng(8)
    nc, gc = caches(gb, dtype)
    n = 6
    k = (rng.normal(0, 1, (n, 3, 64)) * rng.uniform(0.01, 100, (n, 3, 1))).astype(np.float32)
    k[1, 2] = 0.0  # an all-zero head: scale 1
    v = rng.normal(0, 5, (n, 3, 64)).astype(np.float32)
    tables = np.tile(np.array([5, 2, 9, 30, 1], np.int32), (n, 1))
    pos = np.array([0, 15, 16, 17, 40, 79], np.int32)
    NB.kv_write(nc, 0, k, v, tables, pos)
    gb.kv_write(gc, 0, gb.asarray(k), gb.asarray(v), tables, pos)
    assert np.array_equal(gb.to_host(gc.k[0]), nc.k[0])
    assert np.array_equal(gb.to_host(gc.v[0]), nc.v[0])
    if dtype == "fp8":
        assert np.array_equal(gb.to_host(gc.k_scale[0]), nc.k_scale[0])
        assert np.array_equal(gb.to_host(gc.v_scale[0]), nc.v_scale[0])
        raw, sc = encode_kv(k, "fp8")
        assert np.array_equal(gb.to_host(gc.k[0]).reshape(-1, 3, 64)[tables[0][pos // 16] * 16 + pos % 16], raw)


def fill_same(nc, gc, rng, dtype):
    """Identical random K/V bits in both caches."""
    for store in ("k", "v"):
        x = rng.normal(0, 1, getattr(nc, store)[0].shape).astype(np.float32)
        raw, sc = encode_kv(x.reshape(-1, *x.shape[2:]), dtype)
        getattr(nc, store)[0][...] = raw.reshape(x.shape)
        getattr(gc, store)[0][...] = cupy.asarray(raw.reshape(x.shape))
        if sc is not None:
            getattr(nc, store + "_scale")[0][...] = sc.reshape(x.shape[:3])
            getattr(gc, store + "_scale")[0][...] = cupy.asarray(sc.reshape(x.shape[:3]))


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("pt,G,D", [(16, 3, 64), (256, 4, 128), (64, 1, 64), (256, 8, 256), (16, 6, 256)])
def test_decode_attention_over_pages(gb, dtype, pt, G, D):
    rng = np.random.default_rng(pt + G)
    kvh = 2
    width = -(-1200 // pt)
    pages = 2 * width + 1
    nc, gc = caches(gb, dtype, pages, pt, kvh, D)
    fill_same(nc, gc, rng, dtype)
    perm = rng.permutation(pages)
    lane_tables = [perm[:width], perm[width:2 * width]]
    pos = np.array([0, 255, 256, 257, 600, 1100, 15, 1199], np.int32)
    tables = np.stack([lane_tables[i % 2] for i in range(len(pos))]).astype(np.int32)
    q = rng.normal(0, 1, (len(pos), kvh * G, D)).astype(np.float32)
    ref = NB.attention(q, nc, 0, tables, pos)
    out = gb.to_host(gb.attention(gb.asarray(q), gc, 0, tables, pos))
    for i in range(len(pos)):
        assert rel(out[i], ref[i]) < 2e-5, (i, pos[i], rel(out[i], ref[i]))
    # a row alone, or twice in a row (the chunk counters reset), gives the same bits
    for i in (0, 4, 7):
        one = gb.to_host(gb.attention(gb.asarray(q[i:i + 1]), gc, 0, tables[i:i + 1], pos[i:i + 1]))
        assert np.array_equal(one[0], out[i])
    again = gb.to_host(gb.attention(gb.asarray(q), gc, 0, tables, pos))
    assert np.array_equal(again, out)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("G,D", [(4, 128), (6, 256), (2, 16)])
def test_decode_attention_writes_the_rows_new_keys(gb, dtype, G, D):
    """kv_write then decode attention of the same rows: the attention writes the new K/V itself (the
    block owning each row's position); cache bits and outputs equal numpy's, over several chunk
    groups (the two-level merge)."""
    rng = np.random.default_rng(D + G)
    pt, kvh = 16, 2
    pos = np.array([0, 63, 64, 1023, 1024, 2999, 5000], np.int32)
    width = -(-5001 // pt)
    pages = len(pos) * width + 1
    nc, gc = caches(gb, dtype, pages, pt, kvh, D)
    fill_same(nc, gc, rng, dtype)
    perm = rng.permutation(pages - 1)
    tables = np.stack([perm[i * width:(i + 1) * width] for i in range(len(pos))]).astype(np.int32)
    k = rng.normal(0, 1, (len(pos), kvh, D)).astype(np.float32)
    v = rng.normal(0, 1, (len(pos), kvh, D)).astype(np.float32)
    q = rng.normal(0, 1, (len(pos), kvh * G, D)).astype(np.float32)
    NB.kv_write(nc, 0, k, v, tables, pos)
    ref = NB.attention(q, nc, 0, tables, pos)
    tab_d, pos_d = gb.asarray(tables), gb.asarray(pos)
    gb.kv_write(gc, 0, gb.asarray(k), gb.asarray(v), tab_d, pos_d)
    out = gb.to_host(gb.attention(gb.asarray(q), gc, 0, tab_d, pos_d))
    for store in ("k", "v") + (("k_scale", "v_scale") if dtype == "fp8" else ()):
        assert np.array_equal(gb.to_host(getattr(gc, store)[0]), getattr(nc, store)[0]), store
    for i in range(len(pos)):
        assert rel(out[i], ref[i]) < 2e-5, (i, pos[i], rel(out[i], ref[i]))
    # the same rows again (counters reset, keys already written) give the same bits
    again = gb.to_host(gb.attention(gb.asarray(q), gc, 0, tab_d, pos_d))
    assert np.array_equal(again, out)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("G,D", [(4, 128), (6, 256)])
def test_decode_attention_bits_do_not_depend_on_the_blocks_chunks(gb, dtype, G, D):
    """Blocks of one chunk (one or two tile stages), or of 2-16 chunks (two stages, rows past the
    kernel's LONG chunks): the same bits, the new K/V written by whichever block holds the row's
    position."""
    from kernels import launch as KL
    rng = np.random.default_rng(G)
    pt, kvh = 64, 2
    pos = np.array([9000, 4095, 1100, 63, 64, 5000], np.int32)
    width = -(-9001 // pt)
    pages = len(pos) * width
    nc, gc = caches(gb, dtype, pages, pt, kvh, D)
    fill_same(nc, gc, rng, dtype)
    tables = cupy.asarray(rng.permutation(pages).reshape(len(pos), width).astype(np.int32))
    q, k, v = (cupy.asarray(rng.normal(0, 1, (len(pos), h, D)).astype(np.float32)) for h in (kvh * G, kvh, kvh))
    fp8 = dtype == "fp8"
    ksc, vsc = (gc.k_scale[0], gc.v_scale[0]) if fp8 else (None, None)
    outs, caches_after = [], []
    # 12 (kv head, row) pairs; the row at 5,000 takes 1, 1, 16, 2, 4 and 8 chunks a block
    for resident, stages in ((1 << 30, 1), (1 << 30, 2), (1, 2), (480, 2), (240, 2), (120, 2)):
        k_c, v_c = gc.k[0].copy(), gc.v[0].copy()
        out = cupy.empty((len(pos), kvh * G, D), cupy.float32)
        KL.attn_decode(fp8, q, kvh * G * D, D, None, 0.0, None, 0, k, kvh * D, D, None, 0.0, v, kvh * D, D,
                       cupy.asarray(pos), tables, pt, k_c, v_c, ksc, vsc, kvh, G, D, 0.0625, out, len(pos),
                       resident=resident, stages=stages)
        outs.append(cupy.asnumpy(out).view(np.uint32))
        caches_after.append((cupy.asnumpy(k_c), cupy.asnumpy(v_c)))
    for o, c in zip(outs[1:], caches_after[1:]):
        assert np.array_equal(o, outs[0])
        assert all(np.array_equal(a, b) for a, b in zip(c, caches_after[0]))


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("pt,G,D", [(16, 3, 64), (256, 4, 128), (64, 6, 256), (16, 2, 16), (32, 16, 96)])
def test_prompt_attention_is_causal_and_row_invariant(gb, dtype, pt, G, D, fp16):
    """The tensor-core prompt attention against numpy (its hi + lo products are near fp32; the fp16
    precision rounds q and p once to bf16, as K and V are), for each padded head width; a subset of
    the rows, in other blocks, gives the same bits."""
    rng = np.random.default_rng(11 + pt)
    kvh = 2
    import kernels.launch as KL
    KS = KL.PROMPT_SPLIT
    width = -(-(KS + 188) // pt)
    nc, gc = caches(gb, dtype, width + 3, pt, kvh, D)
    fill_same(nc, gc, rng, dtype)
    table = rng.permutation(width + 3)[:width].astype(np.int32)
    pos = np.arange(KS - 72, KS + 67, dtype=np.int32)  # 139 rows across a key split and page edges
    tables = np.tile(table, (len(pos), 1))
    q = rng.normal(0, 1, (len(pos), kvh * G, D)).astype(np.float32)
    ref = NB.attention(q, nc, 0, tables, pos, prompt=True)
    out = gb.to_host(gb.attention(gb.asarray(q), gc, 0, tables, pos, prompt=True, fp16=fp16))
    for i in range(len(pos)):
        assert rel(out[i], ref[i]) < (8e-3 if fp16 else 2e-5), (i, rel(out[i], ref[i]))
    for a, b in ((3, 20), (60, 90)):  # the second crosses the split
        part = gb.to_host(gb.attention(gb.asarray(q[a:b]), gc, 0, tables[a:b], pos[a:b], prompt=True, fp16=fp16))
        assert np.array_equal(part, out[a:b])


# --- argmax and sampling --------------------------------------------------------------------------------
def test_greedy_choice_is_argmax_with_lowest_index_on_ties(gb):
    rng = np.random.default_rng(12)
    x = rng.normal(0, 1, (5, 49152)).astype(np.float32)
    x[1, [7, 100, 40000]] = 50.0
    x[2, :] = 1.0
    x[3, -1] = 99.0
    got = gb.choose(gb.asarray(x), [SamplingParams(temperature=0)] * 5, [0] * 5)
    assert got == np.argmax(x, -1).tolist()


def test_choose_equals_host_sampling(gb):
    from engine.sampling import sample
    rng = np.random.default_rng(13)
    V = 3000
    logits = rng.normal(0, 3, (6, V)).astype(np.float32)
    logits[2, :50] = 7.0  # ties at the top-k edge
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=40, top_p=0.95, seed=3),
              SamplingParams(temperature=0.7, top_k=40, top_p=0.9, seed=5),
              SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=1234),
              SamplingParams(temperature=1.3, top_k=5, top_p=1.0, seed=9), SamplingParams(temperature=0)]
    for trial in range(20):
        positions = [int(p) for p in rng.integers(0, 10000, 6)]
        got = gb.choose(gb.asarray(logits), params, positions)
        want = [sample(logits[i], p, positions[i]) for i, p in enumerate(params)]
        assert got == want


def device_tokens(gb, logits: np.ndarray, params: list[SamplingParams], positions: list[int]) -> list[int]:
    """The kernel's own tokens for top-k rows (no host fallback): sample_rows launched as `choose`
    launches it."""
    import kernels.launch as KL
    from engine.sampling import uniform
    x = gb.asarray(np.ascontiguousarray(logits, np.float32))
    mode = cupy.asarray(np.array([p.top_k for p in params], np.int32))
    par = cupy.asarray(np.array([(p.temperature, p.top_p, uniform(p.seed, pos)) for p, pos in zip(params, positions)],
                                np.float64).reshape(len(params), 3))
    out = cupy.full(len(params), -2, cupy.int32)
    KL.sample(x, x.shape[1], x.shape[1], mode, par, out, len(params))
    return gb.to_host(out).tolist()


@pytest.mark.parametrize("top_k", [1, 2, 40, 1023, 1024, 1025])
def test_device_sampler_equals_host_sampling_at_vocab_size(gb, top_k):
    """Rows of a real vocabulary; top-k up to the kernel's room (1,024), which the kernel chooses itself
    for every row, and one past it (the host)."""
    import kernels.launch as KL
    from engine.sampling import sample
    rng = np.random.default_rng(top_k)
    V = 151936
    logits = rng.normal(0, 2.5, (8, V)).astype(np.float32)
    logits[1, rng.integers(0, V, 3000)] = 9.0  # ties beyond the kernel's candidate room: its exact fallback
    logits[2, :] = 0.0
    logits[2, 5::7] = -0.0  # -0 and +0 are one value: index order decides (V ties: the fallback too)
    logits[3, rng.integers(0, V, 64)] = 11.0  # ties straddling the threshold
    for trial in range(3):
        params = [SamplingParams(temperature=float(t), top_k=top_k, top_p=float(p), seed=int(s))
                  for t, p, s in zip(rng.uniform(0.2, 2.0, 8), rng.choice([1.0, 0.95, 0.5, 1e-9], 8),
                                     rng.integers(0, 1 << 62, 8))]
        positions = [int(p) for p in rng.integers(0, 1 << 20, 8)]
        want = [sample(logits[i], p, positions[i]) for i, p in enumerate(params)]
        assert gb.choose(gb.asarray(logits), params, positions) == want
        if top_k <= KL.SAMPLE_MAX_K:
            assert device_tokens(gb, logits, params, positions) == want


@pytest.mark.parametrize("case", ["flat", "plateau", "k1024"])
def test_device_sampler_takes_the_lowest_index_ties_past_its_room(gb, case):
    """More than SAMPLE_CAP (2,048) logits tie at the k-th largest: the kernel holds the keys above it
    and then the lowest-index ties, as numpy's stable order does, and chooses on the device."""
    from engine.sampling import sample
    rng = np.random.default_rng(["flat", "plateau", "k1024"].index(case) + 70)
    V = 151936
    if case == "flat":  # V ties: the candidates are 0..39
        row, k, T, top_ps = np.zeros(V, np.float32), 40, [1.0], [1.0]
    elif case == "plateau":  # 5 above 3,000 ties: those 5 and the 95 lowest-index ties
        row, k, T, top_ps = rng.uniform(-5.0, 4.0, V).astype(np.float32), 100, [0.5, 3.0], [1.0, 0.95]
        at = rng.choice(V, 3005, replace=False)
        row[at[:3000]] = 5.0
        row[at[3000:]] = rng.uniform(5.5, 8.0, 5)
        assert set(np.argsort(-row, kind="stable")[:k]) == set(at[3000:]) | set(np.sort(at[:3000])[:95])
    else:  # 2,500 ties at the top: the 1,024 lowest-index ones
        row, k, T, top_ps = rng.uniform(-3.0, 3.0, V).astype(np.float32), 1024, [1.0], [1.0, 0.5]
        row[rng.choice(V, 2500, replace=False)] = 9.0
    logits = np.tile(row, (8, 1))
    for trial in range(4):
        params = [SamplingParams(temperature=float(rng.choice(T)), top_k=k, top_p=float(rng.choice(top_ps)),
                                 seed=int(s)) for s in rng.integers(0, 1 << 62, 8)]
        positions = [int(p) for p in rng.integers(0, 1 << 20, 8)]
        want = [sample(row, p, positions[i]) for i, p in enumerate(params)]
        got = device_tokens(gb, logits, params, positions)
        assert got == want, (trial, got, want)
        if case == "flat":
            assert max(got) < k
        assert gb.choose(gb.asarray(logits), params, positions) == want


def test_feed_rows_voids_the_lane_of_a_flagged_row_fed_an_end_token(gb):
    """A decode graph's inputs fed the tokens the graph before chose: the tokens copied in, and a row
    flagged in its token slot and fed an end token gets lane -1 (numpy_backend.decode_step's rule);
    the padding rows and everything after the lanes stay."""
    import kernels.launch as KL
    B, n, ends = 8, 6, (2, 3)
    fed = np.array([5, 2, 7, 2, 9, 3], np.int32)
    flags = np.array([1, 1, 1, 0, 1, 1], np.int32)
    d = np.arange(5 * B, dtype=np.int32) + 100
    d[:n] = flags
    dev = cupy.asarray(d)
    KL.feed_rows(cupy.asarray(fed), dev, B, n, cupy.asarray(np.array(ends, np.int32)), len(ends))
    want = d.copy()
    want[:n] = fed
    want[2 * B:2 * B + n] = np.where((flags != 0) & np.isin(fed, ends), -1, d[2 * B:2 * B + n])
    assert np.array_equal(gb.to_host(dev), want)
    assert (want[2 * B:2 * B + n] == -1).sum() == 2
