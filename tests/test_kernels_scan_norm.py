"""The DeltaNet scan with the gated RMSNorm (kernels/deltanet.cu `deltanet_scan`'s NORM build: a whole
head a block, a warp norming each row with gated_rmsnorm's device function), on the device: the bits of
deltanet_step then gated_rmsnorm, eager and in a captured graph; numpy's within 1e-4 (the step's
rounding, rescaled per head).
"""
import numpy as np
import pytest
from test_kernels_pdl import capture
from test_kernels_qwen3_5 import NB, host, inputs, rel

from engine.ops import cuda_available

OK, WHY = cuda_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not OK, reason=WHY or "no GPU")]

if OK:
    import cupy

    import kernels.launch_qwen3_5 as KQ


def same_bits(a, b) -> bool:
    a, b = host(a), host(b)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def norm_inputs(rng, n, hv, dv):
    """z [n, hv, dv] as the model passes it (a strided view of the in-projection's rows) and w [dv]."""
    zz = cupy.asarray(rng.normal(size=(n, hv * dv + 5)).astype(np.float32))
    return zz[:, 3:3 + hv * dv].reshape(n, hv, dv), cupy.asarray(rng.uniform(.5, 1.5, dv).astype(np.float32))


# (hk, hv, dk, dv): the 35B-A3B's heads; a small head; the tiny models' (16 of a block's 32 columns);
# 48 of 64 columns; and heads without a NORM build (512 threads a block), which take the two ops
NORM_SHAPES = [(16, 32, 128, 128), (2, 4, 32, 64), (2, 4, 16, 16), (1, 3, 64, 48), (2, 2, 128, 256)]


@pytest.mark.parametrize("lanes", [[2], [3, 0, -1], [5, 0, 3, -1, 1, 6, 2, 4]])
@pytest.mark.parametrize("hk,hv,dk,dv", NORM_SHAPES)
def test_deltanet_step_norm_is_step_then_norm(gb, lanes, hk, hv, dk, dv):
    """Decode rows (one; several streams, a padding row among them): deltanet_step_norm, the scan's
    NORM build where it has one, gives the bits of deltanet_step then gated_rmsnorm, output and every
    state slot; and numpy's within the step's rounding."""
    assert (KQ.scan_norm_cols(dk, dv) is None) == (dv == 256)
    rng = np.random.default_rng(len(lanes) * 1000 + dk + dv)
    n, lanes = len(lanes), np.array(lanes, np.int32)
    x = inputs(rng, n, hk, hv, dk, dv)
    q, k, v, g, beta = map(cupy.asarray, x)
    z, w = norm_inputs(rng, n, hv, dv)
    st = rng.normal(0, .3, (9, hv, dk, dv)).astype(np.float32)
    apart, fused = cupy.asarray(st), cupy.asarray(st)
    ref = gb.gated_rmsnorm(gb.deltanet_step(q, k, v, g, beta, apart, lanes), z, w, 1e-6)
    got = gb.deltanet_step_norm(q, k, v, g, beta, fused, lanes, z, w, 1e-6)
    assert same_bits(got, ref) and same_bits(fused, apart)
    live = lanes >= 0  # padding rows: no twin
    nstate = st.copy()
    nref = NB.deltanet_step_norm(*(a[live] for a in x), nstate, lanes[live], host(z)[live], host(w), 1e-6)
    assert rel(host(got)[live], nref) < 1e-4


@pytest.mark.parametrize("W", [4, 20])  # 20: the scan's tiles of 16 end inside the window
@pytest.mark.parametrize("hk,hv,dk,dv", [(16, 32, 128, 128), (2, 4, 32, 64)])
def test_deltanet_step_norm_windows(gb, W, hk, hv, dk, dv):
    """Verify windows (stride > 0) through the NORM build: every row's output, the lanes' states and
    the rows' logs have the bits of deltanet_step's window then gated_rmsnorm; a padding stream too."""
    rng = np.random.default_rng(W * 10 + dk)
    lanes = np.array([2, 0, -1, 3], np.int32)
    stride = len(lanes) + 1  # Cache.window_stride: the lanes and the scratch slot
    row_lanes = np.repeat(lanes, W)
    n = len(row_lanes)
    q, k, v, g, beta = map(cupy.asarray, inputs(rng, n, hk, hv, dk, dv))
    z, w = norm_inputs(rng, n, hv, dv)
    st = cupy.asarray(rng.normal(0, .3, (stride, hv, dk, dv)).astype(np.float32))
    runs = []
    for fused in (False, True):
        rec = st.copy()
        m = (W - 1) * stride
        logs = tuple(cupy.zeros(shape, cupy.float32) for shape in ((m, hv, dk), (m, hv, dv), (m, hv)))
        if fused:
            y = gb.deltanet_step_norm(q, k, v, g, beta, rec, row_lanes, z, w, 1e-6, W, stride, logs)
        else:
            y = gb.gated_rmsnorm(gb.deltanet_step(q, k, v, g, beta, rec, row_lanes, W, stride, logs), z, w, 1e-6)
        runs.append((y, rec, *logs))
    for name, a, b in zip(("y", "state", "k̂ log", "δ log", "e^g log"), *runs):
        assert same_bits(a, b), name


@pytest.mark.parametrize("programmatic", [True, False])
def test_deltanet_step_norm_in_a_graph(programmatic):
    """Two layers' steps captured into a graph, launched programmatically (kernels.pdl) or not:
    each replay gives the eager launches' outputs and states, bit for bit."""
    rng = np.random.default_rng(5)
    hk, hv, dk, dv = 16, 32, 128, 128
    lanes = cupy.asarray(np.array([2, 0, -1], np.int32))
    n = len(lanes)
    q, k, v, g, beta = map(cupy.asarray, inputs(rng, n, hk, hv, dk, dv))
    z, w = norm_inputs(rng, n, hv, dv)
    first = [cupy.asarray(rng.normal(0, .3, (4, hv, dk, dv)).astype(np.float32)) for _ in range(2)]
    states = [s.copy() for s in first]
    ys = [cupy.zeros((n, hv, dv), cupy.float32) for _ in first]

    def layers():
        for state, y in zip(states, ys):
            KQ.deltanet_scan(q, hk * dk, k, hk * dk, v, hv * dv, g, beta, state, lanes, 4, y, n, 1, 0, hk, hv, dk,
                             dv, float(np.float32(dk ** -0.5)), norm=(z, z.strides[0] // 4, w, 1e-6))

    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        layers()
        eager = [host(a) for a in ys + states]
        graph = capture(s, layers, programmatic)
        for _ in range(2):
            for state, st in zip(states, first):
                state[...] = st
            for y in ys:
                y.fill(0)
            graph.launch(s)
            s.synchronize()
            assert all(same_bits(a, e) for a, e in zip(ys + states, eager))
