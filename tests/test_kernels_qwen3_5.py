"""Contract tests of kernels/deltanet.cu and kernels/moe.cu (through engine/ops/cupy_qwen3_5.py) against
their numpy twins, on the device; and the hybrid models end to end on a CuPy backend with the ops
mixed in.

Tolerances: 2e-6 relative (to the output's norm) for the elementwise ops, the conv and the norms
(expf and the summation order differ from numpy); 2e-5 for the recurrent step and 1e-4 for a
prompt chunk (the chunked form on both sides, in other summation orders; a key head dim without a
chunked kernel runs the recurrent form); 5e-5 for the expert
products (fp32 accumulation in another order); routing choices exactly. Rows are checked to be
bit-identical alone and in a batch; padding rows (lane -1) touch only the scratch slot. The scan with
its gated norm: tests/test_kernels_scan_norm.py.
"""
import numpy as np
import pytest

from engine.ops import cuda_available
from engine.ops.numpy_backend import NumpyBackend
from engine.weights import dequantize, quantize

OK, WHY = cuda_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not OK, reason=WHY or "no GPU")]

if OK:
    import cupy

    import kernels.launch_qwen3_5 as KQ
    from engine.ops.cupy_weights import ExpertWeight, QExperts, prepare_experts

NB = NumpyBackend()


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def host(a):
    """A device array, or a lazy one's numbers (moe_experts' pending combination), on the host."""
    from engine.ops.cupy_lazy import Lazy
    return cupy.asnumpy(a.materialize() if isinstance(a, Lazy) else a)


# --- DeltaNet ------------------------------------------------------------------------------------
@pytest.mark.parametrize("C,T", [(7, 37), (128, 37), (300, 37), (128, 2)])  # 2: fewer rows than the state's
def test_conv1d(gb, C, T):
    """Prompt rows in blocks of CONV_ROWS give the serial loop's bits (the step form's)."""
    rng = np.random.default_rng(C)
    K = 4
    x = rng.normal(size=(T, C + 5)).astype(np.float32)[:, 2:C + 2]  # strided rows
    w = rng.normal(size=(C, K)).astype(np.float32)
    st = rng.normal(size=(4, C, K - 1)).astype(np.float32)
    ref_state = st.copy()
    ref = NB.conv1d_prompt(x, w, ref_state, 1)
    dstate = cupy.asarray(st)
    out = gb.conv1d_prompt(cupy.asarray(x), cupy.asarray(w), dstate, 1)
    assert rel(host(out), ref) < 2e-6
    assert rel(host(dstate), ref_state) < 2e-6
    # decode rows on lanes 2, 0 and a padding row (-1 → the scratch slot 3)
    xs = rng.normal(size=(3, C)).astype(np.float32)
    ref_state2 = st.copy()
    ref2 = NB.conv1d_step(xs, w, ref_state2, np.array([2, 0, -1]))
    d2 = cupy.asarray(st)
    out2 = gb.conv1d_step(cupy.asarray(xs), cupy.asarray(w), d2, np.array([2, 0, -1], np.int32))
    assert rel(host(out2), ref2) < 2e-6
    assert rel(host(d2), ref_state2) < 2e-6
    assert np.array_equal(host(d2)[1], st[1])
    # the step form and the prompt form give the same bits
    a, b = cupy.asarray(st), cupy.asarray(st)
    steps = cupy.concatenate([gb.conv1d_step(cupy.asarray(x[t:t + 1]), cupy.asarray(w), a, np.array([0], np.int32))
                              for t in range(T)])
    whole = gb.conv1d_prompt(cupy.asarray(x), cupy.asarray(w), b, 0)
    assert np.array_equal(host(steps), host(whole)) and np.array_equal(host(a), host(b))


def test_deltanet_gates(gb):
    rng = np.random.default_rng(1)
    a = rng.normal(0, 10, (9, 6)).astype(np.float32)
    b = rng.normal(0, 3, (9, 6)).astype(np.float32)
    al, dt = rng.normal(size=6).astype(np.float32), rng.normal(size=6).astype(np.float32)
    g, beta = gb.deltanet_gates(cupy.asarray(a), cupy.asarray(b), cupy.asarray(al), cupy.asarray(dt))
    rg, rb = NB.deltanet_gates(a, b, al, dt)
    assert rel(host(g), rg) < 2e-6 and rel(host(beta), rb) < 2e-6


@pytest.mark.parametrize("hv", [6, 32, 300])
def test_conv1d_step_gates_is_both_ops(gb, hv):
    """The decode rows' conv and gates in one launch: the bits of conv1d_step and deltanet_gates."""
    rng = np.random.default_rng(hv)
    C, K = 300, 4
    x, w = rng.normal(size=(3, C)).astype(np.float32), rng.normal(size=(C, K)).astype(np.float32)
    ab = rng.normal(0, 10, (3, 2 * hv + 5)).astype(np.float32)  # a and b as strided column slices
    al, dt = rng.normal(size=hv).astype(np.float32), rng.normal(size=hv).astype(np.float32)
    st = rng.normal(size=(4, C, K - 1)).astype(np.float32)
    lanes = np.array([2, 0, -1], np.int32)
    d1, d2 = cupy.asarray(st), cupy.asarray(st)
    dab = cupy.asarray(ab)
    a, b = dab[:, 1:1 + hv], dab[:, 3 + hv:3 + 2 * hv]
    out, g, beta = gb.conv1d_step_gates(cupy.asarray(x), cupy.asarray(w), d1, lanes, a, b, cupy.asarray(al),
                                        cupy.asarray(dt))
    ref = gb.conv1d_step(cupy.asarray(x), cupy.asarray(w), d2, lanes)
    rg, rb = gb.deltanet_gates(a, b, cupy.asarray(al), cupy.asarray(dt))
    assert np.array_equal(host(out), host(ref)) and np.array_equal(host(d1), host(d2))
    assert np.array_equal(host(g), host(rg)) and np.array_equal(host(beta), host(rb))
    ng, nb = NB.deltanet_gates(ab[:, 1:1 + hv], ab[:, 3 + hv:3 + 2 * hv], al, dt)
    assert rel(host(g), ng) < 2e-6 and rel(host(beta), nb) < 2e-6


def inputs(rng, n, hk, hv, dk, dv, slow: bool = False):
    """Random rows; slow: log decays in [-0.05, 0] (the default gates decay fast, so only nearby rows
    of a chunk interact: slow ones exercise whole chunks)."""
    q = rng.normal(size=(n, hk, dk)).astype(np.float32)
    k = rng.normal(size=(n, hk, dk)).astype(np.float32)
    v = rng.normal(size=(n, hv, dv)).astype(np.float32)
    g, beta = NB.deltanet_gates(rng.normal(size=(n, hv)).astype(np.float32),
                                rng.normal(size=(n, hv)).astype(np.float32),
                                np.log(rng.uniform(1, 16, hv)).astype(np.float32),
                                rng.normal(0, .5, hv).astype(np.float32))
    if slow:
        g = -rng.uniform(0, .05, (n, hv)).astype(np.float32)
    return q, k, v, g, beta


@pytest.mark.parametrize("hk,hv,dk,dv", [(2, 4, 16, 16), (2, 4, 8, 8), (4, 8, 128, 128), (1, 3, 64, 32),
                                         (2, 2, 256, 64), (16, 32, 128, 128), (2, 4, 64, 48)])
def test_deltanet_step(gb, hk, hv, dk, dv):
    rng = np.random.default_rng(dk + dv)
    n = 5
    q, k, v, g, beta = inputs(rng, n, hk, hv, dk, dv)
    lanes = np.array([3, 0, 2, -1, -1], np.int32)[:n]
    st = rng.normal(0, .3, (5, hv, dk, dv)).astype(np.float32)
    ref_state = st.copy()
    ref = NB.deltanet_step(*(a[:3] for a in (q, k, v, g, beta)), ref_state, lanes[:3])  # padding rows: no twin
    d = cupy.asarray(st)
    out = host(gb.deltanet_step(*map(cupy.asarray, (q, k, v, g, beta)), d, lanes))
    assert rel(out[:3], ref) < 2e-5
    hs = host(d)
    assert rel(hs[:4], ref_state[:4]) < 2e-5 and np.array_equal(hs[1], st[1])
    # a row alone gives the bits it gives in the batch
    for i in range(3):
        d1 = cupy.asarray(st)
        one = host(gb.deltanet_step(*(cupy.asarray(a[i:i + 1]) for a in (q, k, v, g, beta)), d1, lanes[i:i + 1]))
        assert np.array_equal(one[0], out[i]) and np.array_equal(host(d1)[lanes[i]], hs[lanes[i]])


def packed(x, rng):
    """q, k, v as the model passes them: row-strided views of one [T, 2·Hk·Dk + Hv·Dv + 3] array."""
    q, k, v = x
    T, kd = len(q), q[0].size
    y = rng.normal(size=(T, 2 * kd + v[0].size + 3)).astype(np.float32)
    y[:, 1:1 + kd], y[:, 1 + kd:1 + 2 * kd], y[:, 1 + 2 * kd:-2] = (a.reshape(T, -1) for a in (q, k, v))
    d = cupy.asarray(y)
    cols = (slice(1, 1 + kd), slice(1 + kd, 1 + 2 * kd), slice(1 + 2 * kd, -2))
    return tuple(d[:, c].reshape(a.shape) for c, a in zip(cols, (q, k, v)))


@pytest.mark.parametrize("T,hk,hv,dk,dv", [(T, 2, 4, dk, dk) for T in (1, 63, 64, 65, 128, 200) for dk in (16, 128)]
                         + [(128, 16, 48, 128, 128), (128, 16, 32, 128, 128)]  # the 27B's and 35B-A3B's heads
                         + [(130, 2, 4, 8, 8), (200, 2, 4, 64, 48), (70, 1, 3, 32, 40)]  # partial column blocks
                         + [(3, 2, 2, 256, 64), (70, 2, 2, 256, 64)])  # no chunked kernel: the recurrent form
@pytest.mark.parametrize("slow", [False, True])
def test_deltanet_prompt(gb, T, hk, hv, dk, dv, slow):
    """The chunked form against numpy's from a nonzero state on lane 1 (the other slots untouched);
    row-strided inputs give the bits of contiguous ones."""
    rng = np.random.default_rng(T + dk)
    q, k, v, g, beta = inputs(rng, T, hk, hv, dk, dv, slow)
    st = rng.normal(0, .3, (3, hv, dk, dv)).astype(np.float32)
    ref_state = st.copy()
    ref = NB.deltanet_prompt(q, k, v, g, beta, ref_state, 1, 64)
    d = cupy.asarray(st)
    out = host(gb.deltanet_prompt(*map(cupy.asarray, (q, k, v, g, beta)), d, 1, 64))
    assert rel(out, ref) < 1e-4
    assert rel(host(d), ref_state) < 1e-4
    assert np.array_equal(host(d)[[0, 2]], st[[0, 2]])
    d2 = cupy.asarray(st)
    out2 = host(gb.deltanet_prompt(*packed((q, k, v), rng), *map(cupy.asarray, (g, beta)), d2, 1, 64))
    assert np.array_equal(out2, out) and np.array_equal(host(d2), host(d))


@pytest.mark.parametrize("hk,hv,dk,dv,T", [(16, 48, 128, 128, 130), (2, 4, 16, 16, 65), (2, 4, 8, 8, 1),
                                           (2, 2, 256, 64, 17)])
def test_deltanet_prompt_then_steps(gb, hk, hv, dk, dv, T):
    """Decode rows stepping on from a prompt's end state: numpy's prompt then numpy's steps, within rounding."""
    rng = np.random.default_rng(T + dk + 1)
    n = 5
    q, k, v, g, beta = inputs(rng, T + n, hk, hv, dk, dv, slow=True)
    st = rng.normal(0, .3, (3, hv, dk, dv)).astype(np.float32)
    ref_state = st.copy()
    ref = [NB.deltanet_prompt(*(a[:T] for a in (q, k, v, g, beta)), ref_state, 2, 64)]
    d = cupy.asarray(st)
    got = [host(gb.deltanet_prompt(*(cupy.asarray(a[:T]) for a in (q, k, v, g, beta)), d, 2, 64))]
    for t in range(T, T + n):
        ref.append(NB.deltanet_step(*(a[t:t + 1] for a in (q, k, v, g, beta)), ref_state, np.array([2], np.int32)))
        got.append(host(gb.deltanet_step(*(cupy.asarray(a[t:t + 1]) for a in (q, k, v, g, beta)), d,
                                         np.array([2], np.int32))))
    for u, r in zip(got, ref):
        assert rel(u, r) < 1e-4
    assert rel(host(d), ref_state) < 1e-4


@pytest.mark.parametrize("hk,hv,dk,dv", [(16, 48, 128, 128), (2, 4, 16, 16), (1, 3, 64, 48)])
def test_deltanet_prompt_bits(gb, hk, hv, dk, dv):
    """A prompt's bits are a function of its rows alone: the same call twice gives the same bits, and
    the rows cut into calls at multiples of 64 (prompt chunks at absolute positions) give one call's."""
    rng = np.random.default_rng(dk + hv)
    T = 200
    x = [cupy.asarray(a) for a in inputs(rng, T, hk, hv, dk, dv, slow=True)]
    st = cupy.asarray(rng.normal(0, .3, (2, hv, dk, dv)).astype(np.float32))
    runs = []
    for cuts in ((0, T), (0, T), (0, 64, T), (0, 128, T), (0, 64, 128, 192, T)):
        d = st.copy()
        out = [host(gb.deltanet_prompt(*(a[a0:a1] for a in x), d, 0, 64)) for a0, a1 in zip(cuts, cuts[1:])]
        runs.append((np.concatenate(out), host(d)))
    for out, state in runs[1:]:
        assert np.array_equal(out, runs[0][0]) and np.array_equal(state, runs[0][1])


WINDOW_SHAPES = [(16, 48, 128, 128), (16, 32, 128, 128)]  # 27B's and 35B-A3B's DeltaNet heads (hk, hv, dk, dv)


@pytest.mark.parametrize("W,hk,hv,dk,dv", [(W, *shape) for W in (1, 2, 4, 8) for shape in WINDOW_SHAPES]
                         + [(17, 2, 4, 16, 16)])  # 17 rows: the scan's tiles of 16 end inside the window
def test_window_is_the_row_by_row_loop(gb, W, hk, hv, dk, dv):
    """Verify windows in one conv (+ gates) launch and one scan launch give the bits of the window
    stepped one row at a time: every output, every conv slot (row j of every stream on its window
    slot), and, for every accepted row, the DeltaNet state `deltanet_keep` rebuilds from row 0's
    state and the rows' logs; a padding stream (lane -1) steps the scratch slots. And the numpy twin
    (its own window and keep) within rounding."""
    from engine.kv import Cache
    rng = np.random.default_rng(W * 100 + hv)
    K, C = 4, 2 * hk * dk + hv * dv
    lanes = np.array([2, 0, -1, 3], np.int32)  # 4 lanes (lane 1 idle) and a padding stream
    cache = Cache(gb, layers=1, pages=2, page_tokens=16, kv_heads=1, head_dim=16, kv_dtype="bf16", lanes=4,
                  state_shapes=[((C, K - 1), (hv, dk, dv))], state_logs=[((hv, dk), (hv, dv), (hv,))],
                  draft_tokens=W - 1)
    n, stride = len(lanes) * W, cache.window_stride
    conv0 = rng.normal(size=cache.state[0][0].shape).astype(np.float32)
    rec0 = rng.normal(0, .3, cache.state[0][1].shape).astype(np.float32)
    assert rec0.shape[0] == 5 and conv0.shape[0] == 5 * W  # the state keeps its lane slots alone
    y = rng.normal(size=(n, C + 2 * hv + 3)).astype(np.float32)  # [qkv | a | b | ...]: strided views, as the model's
    w = rng.normal(size=(C, K)).astype(np.float32)
    al, dt = np.log(rng.uniform(1, 16, hv)).astype(np.float32), rng.normal(0, .5, hv).astype(np.float32)
    dy, dw, dal, ddt = map(cupy.asarray, (y, w, al, dt))
    qkv, a, b = dy[:, :C], dy[:, C:C + hv], dy[:, C + hv:C + 2 * hv]

    def split(x):
        m, kd = len(x), hk * dk
        return x[:, :kd].reshape(m, hk, dk), x[:, kd:2 * kd].reshape(m, hk, dk), x[:, 2 * kd:].reshape(m, hv, dv)

    # the row-by-row loop: one conv (+ gates) and one scan launch per window row; the state after each row
    conv, rec = cupy.asarray(conv0), cupy.asarray(rec0)
    ref = [cupy.empty((n, C), cupy.float32), cupy.empty((n, hv), cupy.float32), cupy.empty((n, hv), cupy.float32),
           cupy.empty((n, hv, dv), cupy.float32)]
    after = []
    for j in range(W):
        at = cache.window_slots(lanes, j)
        if j:  # the fork: row j's conv starts from a copy of row j-1's
            conv[cupy.asarray(at)] = conv[cupy.asarray(cache.window_slots(lanes, j - 1))]
        x, g, beta = gb.conv1d_step_gates(qkv[j::W], dw, conv, at, a[j::W], b[j::W], dal, ddt)
        ref[0][j::W], ref[1][j::W], ref[2][j::W] = x, g, beta
        ref[3][j::W] = gb.deltanet_step(*split(x), g, beta, rec, lanes)
        after.append(host(rec))
    ref = [host(r) for r in (*ref, conv)]

    # every window row of every stream at once, then each accepted row kept
    row_lanes = np.repeat(lanes, W)
    conv, rec = cupy.asarray(conv0), cupy.asarray(rec0)
    x, g, beta = gb.conv1d_step_gates(qkv, dw, conv, row_lanes, a, b, dal, ddt, W, stride)
    o = gb.deltanet_step(*split(x), g, beta, rec, row_lanes, W, stride, cache.logs[0])
    got = [host(r) for r in (x, g, beta, o, conv)]
    for name, u, v in zip(("conv out", "g", "beta", "o", "conv state"), got, ref):
        assert np.array_equal(u, v), name
    assert np.array_equal(host(rec)[lanes], after[0][lanes])  # row 0's state on the lanes' slots
    live = lanes[lanes >= 0]
    step = rec.copy()  # kept a row at a time (a stream that may end at any row of its window)
    for row in range(W):
        kept = rec.copy()
        for lane in live:
            gb.deltanet_keep([kept], [cache.logs[0]], int(lane), 1, row, stride)
            if row:
                gb.deltanet_keep([step], [cache.logs[0]], int(lane), row, row, stride)
        assert np.array_equal(host(kept)[live], after[row][live]), row
        assert np.array_equal(host(step)[live], after[row][live]), row

    # the numpy twin: the same windows row by row on the host, its own logs and keep
    nconv, nrec = conv0.copy(), rec0.copy()
    nlogs = tuple(np.zeros(a.shape, np.float32) for a in cache.logs[0])
    nx, ng, nbeta = NB.conv1d_step_gates(y[:, :C], w, nconv, row_lanes, y[:, C:C + hv], y[:, C + hv:C + 2 * hv], al, dt,
                                         W, stride)
    kd = hk * dk
    no = NB.deltanet_step(nx[:, :kd].reshape(n, hk, dk), nx[:, kd:2 * kd].reshape(n, hk, dk),
                          nx[:, 2 * kd:].reshape(n, hv, dv), ng, nbeta, nrec, row_lanes, W, stride, nlogs)
    NB.deltanet_keep([nrec], [nlogs], 3, 1, W - 1, stride)
    gb.deltanet_keep([rec], [cache.logs[0]], 3, 1, W - 1, stride)
    tols = (2e-6, 2e-6, 2e-6, 2e-5, 2e-6, 2e-5)
    for u, v, tol in zip((*got, host(rec)[3]), (nx, ng, nbeta, no, nconv, nrec[3]), tols):
        assert rel(u, v) < tol


def test_gated_rmsnorm(gb):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 4, 48)).astype(np.float32)
    zz = rng.normal(size=(5, 4 * 48 + 16)).astype(np.float32)
    z = zz[:, 8:8 + 4 * 48].reshape(5, 4, 48)  # a strided view, as the model passes it
    w = rng.uniform(.5, 1.5, 48).astype(np.float32)
    out = gb.gated_rmsnorm(cupy.asarray(x), cupy.asarray(zz)[:, 8:8 + 4 * 48].reshape(5, 4, 48), cupy.asarray(w), 1e-6)
    assert rel(host(out), NB.gated_rmsnorm(x, z, w, 1e-6)) < 2e-6


# --- MoE -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("E,k", [(8, 2), (256, 8), (60, 4), (300, 8)])
def test_moe_route(gb, E, k):
    rng = np.random.default_rng(E)
    logits = rng.normal(size=(33, E)).astype(np.float32)
    logits[0, 5] = logits[0, 1]
    idx, w = gb.moe_route(cupy.asarray(logits), k)
    ridx, rw = NB.moe_route(logits, k)
    assert np.array_equal(host(idx), ridx)
    assert rel(host(w), rw) < 2e-6
    # the shared expert's gate logit as a strided column (as the router_gate product gives it): choice k
    both = np.concatenate([logits, rng.normal(size=(33, 1)).astype(np.float32)], 1)
    sidx, sw = gb.moe_route(cupy.asarray(both)[:, :E], k, cupy.asarray(both)[:, E:])
    ridx, rw = NB.moe_route(logits, k, both[:, E:])
    assert np.array_equal(host(sidx), ridx) and (ridx[:, k] == E).all()
    assert rel(host(sw), rw) < 2e-6


def check_slots(s, experts: np.ndarray, E: int) -> None:
    """A slot table groups every id once: each slot one expert's ids, at most R of them, an expert
    ceil(count / R) slots, the used slots first and the rest empty."""
    from kernels.launch_qwen3_5 import slot_rows
    R = slot_rows(s.nt)
    t = host(s.table).reshape(s.Z, 2 + R)
    used = int((t[:, 1] > 0).sum())
    assert (t[:used, 1] > 0).all() and (t[used:, 1] == 0).all() and (t[:used, 1] <= R).all()
    ids = np.concatenate([t[z, 2:2 + t[z, 1]] for z in range(used)])
    assert np.array_equal(np.sort(ids), np.arange(experts.size))
    for z in range(used):
        assert (experts.ravel()[t[z, 2:2 + t[z, 1]]] == t[z, 0]).all()
    counts = np.bincount(experts.ravel(), minlength=E)
    assert np.array_equal(np.bincount(t[:used, 0], minlength=E), -(-counts // R))


@pytest.mark.parametrize("nk,E", [(9, 257), (72, 257), (360, 65), (40, 8), (2000, 1024)])
def test_moe_slots_group_every_id_once(nk, E):
    """moe_slots' table, for few ids (slots of 4) and many ids over few experts (slots of 16)."""
    import kernels.launch_qwen3_5 as KQ
    experts = np.random.default_rng(nk).integers(0, E, nk).astype(np.int32)
    check_slots(KQ.moe_slots(cupy.asarray(experts), E), experts, E)


def test_moe_route_slots_is_route_then_slots(gb):
    """Decode rows (up to 32) are routed and grouped by expert in one launch, the shared expert
    appended as expert E: the same choices as numpy's, the same products' bits as moe_slots' grouping;
    more rows take the two launches."""
    rng = np.random.default_rng(11)
    E, H, I, k = 64, 96, 64, 8
    dgu = prepare_experts(quantize(rng.normal(0, H ** -.5, (E + 1, 2 * I, H)).astype(np.float32), 4, 32))
    ddn = prepare_experts(quantize(rng.normal(0, I ** -.5, (E + 1, H, I)).astype(np.float32), 4, 32))
    for n in (1, 5, 32, 40):
        both = rng.normal(size=(n, E + 1)).astype(np.float32)
        x = cupy.asarray(rng.normal(size=(n, H)).astype(np.float32))
        idx, w = gb.moe_route(cupy.asarray(both)[:, :E], k, cupy.asarray(both)[:, E:])
        assert (gb._routed is not None) == (n <= 32)
        ridx, rw = NB.moe_route(both[:, :E], k, both[:, E:])
        assert np.array_equal(host(idx), ridx) and rel(host(w), rw) < 2e-6
        if n <= 32:
            check_slots(gb._routed[2], ridx, E + 1)
        fused = host(gb.moe_experts(x, dgu, ddn, idx, w))
        apart = host(gb.moe_experts(x, dgu, ddn, idx.copy(), w))  # another array: moe_slots of its own
        assert np.array_equal(fused, apart)


@pytest.mark.parametrize("fmt,E,H,I,k,n", [("f32", 8, 64, 32, 2, 9), ("q4", 8, 64, 32, 2, 9), ("q8", 8, 64, 32, 2, 9),
                                             ("q4", 64, 96, 64, 8, 40), ("q8", 64, 96, 64, 8, 40),
                                             ("q4+16", 16, 64, 32, 4, 12)])
@pytest.mark.parametrize("prompt", [False, True])
def test_moe_experts(gb, fmt, E, H, I, k, n, prompt):
    """Quantized experts run on qmv over rows grouped by expert (slots of 4 or 16; down's 96 rows pad
    per expert); each row's bits are its own, alone or in any company."""
    rng = np.random.default_rng(7)
    gu = rng.normal(0, H ** -.5, (E, 2 * I, H)).astype(np.float32)
    dn = rng.normal(0, I ** -.5, (E, H, I)).astype(np.float32)
    if fmt != "f32":  # q4+16: down in groups of 16 (GGUF's Q6_K beside Q4_K), off qmv's layout
        bits = 8 if fmt == "q8" else 4
        gu_w, dn_w = quantize(gu, bits, 32), quantize(dn, bits, 16 if fmt == "q4+16" else 32)
        gu, dn = dequantize(gu_w), dequantize(dn_w)
        dgu, ddn = prepare_experts(gu_w), prepare_experts(dn_w)
        assert isinstance(dgu, QExperts) and isinstance(ddn, ExpertWeight if fmt == "q4+16" else QExperts)
        assert np.array_equal(host(ddn.dequantize()), dn)
    else:
        dgu, ddn = prepare_experts(gu), prepare_experts(dn)
    x = rng.normal(size=(n, H)).astype(np.float32)
    idx, w = NB.moe_route(rng.normal(size=(n, E)).astype(np.float32), k)
    if E > 8:  # every row shares expert 3 (a slot of many rows), each row's experts still distinct
        idx[idx == 3] = idx[:, :1].repeat(k, 1)[idx == 3]
        idx[:, 0] = 3
    ref = NB.moe_experts(x, gu, dn, idx, w, prompt)

    sg = rng.normal(size=(n, H + 1)).astype(np.float32)  # [shared | gate], as strided views
    s, gt = sg[:, :H], sg[:, H:]

    def run(rows, shared=False):
        more = (cupy.asarray(sg[rows])[:, :H], cupy.asarray(sg[rows])[:, H:]) if shared else ()
        return host(gb.moe_experts(cupy.asarray(x[rows]), dgu, ddn, cupy.asarray(idx[rows]), cupy.asarray(w[rows]),
                                   prompt, *more))
    out = run(np.arange(n))
    assert rel(out, ref) < 5e-5
    got = run(np.arange(n), shared=True)  # the shared expert's gated add, folded into the combination
    assert rel(got, NB.moe_experts(x, gu, dn, idx, w, prompt, s, gt)) < 5e-5
    assert rel(got, out + s / (np.float32(1) + np.exp(-gt))) < 2e-6
    for rows in ([0], [n - 1], [4], list(range(n - 1, -1, -3))):  # alone or in other company: the same bits
        assert np.array_equal(run(rows), out[rows])
        assert np.array_equal(run(rows, shared=True), got[rows])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("prompt", [False, True])
def test_moe_experts_stage_a_pending_rmsnorm(gb, bits, prompt):
    """Decode rows: the experts' gate_up stages the layer's pending RMSNorm from h = x + res (qmv's
    mode 2: h·w in, the product divided by h's rms over K); a prompt chunk's rows are
    normed first. Both close to numpy's products of the normed rows, each row's bits its own alone
    or in any company."""
    rng = np.random.default_rng(13 + bits)
    E, H, I, k, n = 64, 2048, 64, 8, 12
    group = 32 if bits == 8 else 64
    gu_w = quantize(rng.normal(0, H ** -.5, (E, 2 * I, H)).astype(np.float32), bits, group)
    dn_w = quantize(rng.normal(0, I ** -.5, (E, H, I)).astype(np.float32), bits, group)
    dgu, ddn = prepare_experts(gu_w), prepare_experts(dn_w)
    x, r = rng.normal(size=(n, H)).astype(np.float32), rng.normal(size=(n, H)).astype(np.float32)
    nw = rng.uniform(.5, 1.5, H).astype(np.float32)
    idx, w = NB.moe_route(rng.normal(size=(n, E)).astype(np.float32), k)

    def run(rows):
        normed, _ = gb.add_rmsnorm(cupy.asarray(x[rows]), cupy.asarray(r[rows]), cupy.asarray(nw), 1e-6)
        return host(gb.moe_experts(normed, dgu, ddn, cupy.asarray(idx[rows]), cupy.asarray(w[rows]), prompt))
    out = run(np.arange(n))
    hn, _ = NB.add_rmsnorm(x, r, nw, 1e-6)
    assert rel(out, NB.moe_experts(hn, dequantize(gu_w), dequantize(dn_w), idx, w, prompt)) < 1e-4
    for rows in ([0], [n - 1], list(range(n - 1, -1, -3))):
        assert np.array_equal(run(rows), out[rows])


@pytest.mark.parametrize("k", [9, 8])  # 8 choices and the shared expert; 8 (rows past whole threes)
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_next_product_stages_the_experts_combination(gb, n, k):
    """Decode rows: moe_experts returns the combination pending, and the next 1-2 row product sums it as
    it stages rmsnorm(res + it) (qmv's combine): the product and h = res + it have the bits of
    moe_combine followed by the same product; elsewhere it is materialised, the same bits."""
    import kernels.launch as KL
    from engine.ops.cupy_lazy import Combined
    rng = np.random.default_rng(n + k)
    M, H = 12352, 2048  # the 35B-A3B's in-projection after its MoE
    qw = gb.prepare(quantize(rng.normal(0, H ** -.5, (M, H)).astype(np.float32), 4, 64))
    y = cupy.asarray(rng.normal(size=(n * k, H)).astype(np.float32))
    w = cupy.asarray(rng.uniform(0, .3, (n, k)).astype(np.float32))
    res, nw = cupy.asarray(rng.normal(size=(n, H)).astype(np.float32)), cupy.asarray(rng.uniform(.5, 1.5, H))
    nw = nw.astype(cupy.float32)
    comb = Combined(y, w, k)
    normed, h = gb.add_rmsnorm(comb, res, nw, 1e-6)
    got, got_h = host(gb.linear(normed, qw)), host(h.materialize())
    assert (not comb.written) == KL.qmv_combines(n, M, H, KL.sm_count()) == (n <= 2)  # summed as staged
    out = cupy.empty((n, H), cupy.float32)
    KQ.moe_combine(y, w, k, out, H, n)
    normed, h = gb.add_rmsnorm(out, res, nw, 1e-6)
    assert np.array_equal(got, host(gb.linear(normed, qw))) and np.array_equal(got_h, host(h.materialize()))


@pytest.mark.parametrize("E,H", [(256, 2048), (512, 4096), (8, 64)])
def test_router_gate_rows(gb, E, H):
    """The router and the shared expert's gate as one 8-bit weight: the router's logits and the gate's
    bits are those of the separate products, on plain and norm-folded input."""
    from engine.models.llama import fuse
    rng = np.random.default_rng(E)
    router = quantize(rng.normal(0, H ** -.5, (E, H)).astype(np.float32), 8, 64)
    gate = quantize(rng.normal(0, H ** -.5, (1, H)).astype(np.float32), 8, 64)
    both, wr, wg = gb.prepare(fuse([router, gate])), gb.prepare(router), gb.prepare(gate)
    x, r = rng.normal(size=(5, H)).astype(np.float32), rng.normal(size=(5, H)).astype(np.float32)
    nw = rng.uniform(.5, 1.5, H).astype(np.float32)
    for make in (lambda: gb.asarray(x), lambda: gb.add_rmsnorm(gb.asarray(x), gb.asarray(r), gb.asarray(nw), 1e-6)[0]):
        y = host(gb.linear(make(), both))
        assert np.array_equal(y[:, :E], host(gb.linear(make(), wr)))
        assert np.array_equal(y[:, E:], host(gb.linear(make(), wg)))


# --- the models end to end -------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["exact", "fp16"])
@pytest.mark.parametrize("name", ["tiny-qwen3.5", "tiny-qwen3.5-moe"])
def test_models_match_numpy(gb, name, precision):
    """Exact prompt products: today's tolerance and the same greedy tokens; fp16 ones (2^-11 an
    element): ten times the tolerance, and the tokens may part at a near tie, so only the logits."""
    from engine.engine import run_to_end
    from engine.models import build
    from engine.plan import make_plan
    from engine.scheduler import Scheduler
    from engine.settings import EngineSettings, SamplingParams
    from engine.synthetic import synthetic
    from engine.textstream import TextStream

    s = EngineSettings(model=f"synthetic:{name}", parallel=3, context=512, memory_gib=1, prefill_precision=precision)
    loaded = synthetic(name)
    prompts = [[20 + (i * 7 + j) % 200 for i in range(n)] for j, n in enumerate((150, 37, 3))]
    out = {}
    for backend in (NB, gb):
        model = build(loaded, backend)
        sched = Scheduler(s, make_plan(loaded.config, s, 1 << 34), model, backend, loaded.tokenizer)
        logits = sched.prompt_logits(prompts[0])
        seqs = []
        from engine.scheduler import Sequence
        for i, p in enumerate(prompts):
            seqs.append(Sequence(i + 1, list(p), len(p), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                                 lambda e: None, TextStream(loaded.tokenizer.stream(), [])))
        run_to_end(sched, seqs)
        out[backend.name] = (logits, [q.tokens[q.prompt_len:] for q in seqs])
    assert rel(out["cupy"][0], out["numpy"][0]) < (1e-3 if precision == "exact" else 1e-2)
    if precision == "exact":
        assert out["cupy"][1] == out["numpy"][1]
