"""The drafter ops of the CuPy backend (engine/ops/cupy_drafters.py) against the numpy backend's,
the DFlash2 drafter on the GPU against the same drafter on numpy, and drafted == plain on the GPU
(decode graphs on). GPU only: they skip without a device."""
from types import SimpleNamespace

import numpy as np
import pytest

from engine.drafters.dflash2_config import SYNTHETIC
from engine.kv import Cache
from engine.ops import cuda_available
from engine.ops.numpy_backend import NumpyBackend
from engine.settings import EngineSettings, SamplingParams

OK, WHY = cuda_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not OK, reason=WHY or "no GPU")]
RING = (2, 20, 2, 16)  # layers, positions, kv heads, head dim


GB_GRAPHS = True  # conftest's gb: decode steps replay captured graphs


def caches(gb):
    def make(b):
        return Cache(b, layers=1, pages=2, page_tokens=16, kv_heads=2, head_dim=16, kv_dtype="bf16", lanes=2,
                     ring=RING)
    return make(NumpyBackend()), make(gb)


@pytest.mark.parametrize("window,causal", [(None, False), (12, False), (12, True)])
def test_ring_write_and_attention_match_numpy(gb, window, causal):
    rng = np.random.default_rng(1)
    nc, gc = caches(gb)
    nb = NumpyBackend()
    for lo, hi in ((0, 20), (20, 31)):  # the second write wraps the ring
        pos = np.arange(lo, hi, dtype=np.int32)
        k, v = rng.normal(0, 1, (2, hi - lo, 2, 16)).astype(np.float32)
        for b, c in ((nb, nc), (gb, gc)):
            b.ring_write(c, 1, 1, b.asarray(k), b.asarray(v), pos)
            c.ring_mark(1, pos)
    for a, b in zip(nc.ring_k + nc.ring_v + [nc.ring_pos], gc.ring_k + gc.ring_v + [gc.ring_pos]):
        assert np.array_equal(a, gb.to_host(b))
    B, first = 8, 31
    q, w = rng.normal(0, 1, (B, 4, 16)).astype(np.float32), rng.uniform(0.5, 1.5, 16).astype(np.float32)
    kb, vb = rng.normal(0, 1, (2, B, 2, 16)).astype(np.float32)
    pos = np.arange(first, first + B, dtype=np.int32)
    outs = []
    for b, c in ((nb, nc), (gb, gc)):
        qq = b.rope(b.rmsnorm(b.asarray(q), b.asarray(w), 1e-6), b.asarray(pos), 1e6, 16)  # lazy on the GPU
        outs.append(b.to_host(b.ring_attention(qq, b.asarray(kb), b.asarray(vb), c, 1, 1, first, window, causal)))
    assert np.abs(outs[0] - outs[1]).max() < 1e-4


def test_dynamic_conv_and_top_k_match_numpy(gb):
    rng = np.random.default_rng(2)
    nb = NumpyBackend()
    x, base = rng.normal(0, 1, (8, 64)).astype(np.float32), rng.normal(0, 1, (2, 64)).astype(np.float32)
    dyn = rng.normal(0, 1, (8, 2 * 4)).astype(np.float32)
    ref = nb.dynamic_conv(x, dyn, base, 16)
    got = gb.to_host(gb.dynamic_conv(gb.asarray(x), gb.asarray(dyn), gb.asarray(base), 16))
    assert np.abs(ref - got).max() < 1e-5
    logits = rng.normal(0, 3, (7, 1000)).astype(np.float32)
    (rv, ri), (gv, gi) = nb.top_k(logits, 16), gb.top_k(gb.asarray(logits), 16)
    assert np.array_equal(ri, gi) and np.abs(rv - gv).max() == 0 and ri.dtype == gi.dtype == np.int64


def settings(backend: str, **kw) -> EngineSettings:
    base = dict(model="synthetic:tiny-qwen3.5", backend=backend, parallel=4, context=256, paging="all",
                page_tokens=16, drafter="dflash2", drafter_model=SYNTHETIC, draft_tokens=7)
    base.update(kw)
    return EngineSettings(**base)


def test_the_drafters_block_and_drafts_on_the_gpu_match_numpy():
    from engine.engine import Runner
    rs = [Runner(settings(b), log=lambda m: None) for b in ("numpy", "cupy")]
    d0 = rs[0].scheduler(settings("numpy")).verifier.drafter
    taps = np.random.default_rng(3).normal(0, 2, (70, len(d0.taps) * 64)).astype(np.float32)
    outs, drafts = [], []
    for r in rs:
        sched = r.scheduler(settings(r.backend.name))
        d = sched.verifier.drafter
        lane = sched.lanes.acquire()
        sched.cache.reset(lane.index)
        for a, b in ((0, 30), (30, 70)):
            d.observe(SimpleNamespace(lane=lane), a, r.backend.asarray(taps[a:b]))
        out = d.block(33, 70, lane.index)
        outs.append(r.backend.to_host(out))
        drafts.append(d.choose(out, 33, 7))
    assert np.abs(outs[0] - outs[1]).max() <= 2e-3 * np.abs(outs[0]).max()
    assert drafts[0] == drafts[1]


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_drafted_equals_plain_on_the_gpu(kv_dtype):
    from dataclasses import replace

    from engine.engine import Runner, run_to_end
    s = settings("cupy", kv_dtype=kv_dtype)
    r = Runner(s, log=lambda m: None)
    ps = [[1] + [16 + (i * 11 + j * 5) % 60 for j in range(13 + 23 * i)] for i in range(3)]

    def go(st, params, which):
        sched = r.scheduler(st)
        seqs = [r.sequence(i + 1, st, None, params, lambda e: None, ps[i]) for i in which]
        run_to_end(sched, seqs)
        return seqs
    for params in (SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                   SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=40, seed=3, ignore_eos=True)):
        plain = [q.tokens for q in go(replace(s, drafter="none"), params, range(3))]
        together = go(s, params, range(3))
        assert [q.tokens for q in together] == plain
        assert go(s, params, [1])[0].tokens == plain[1]
        assert sum(q.stats.windows for q in together) > 20
    assert r.backend.graph_stats().captured > 0


def test_gates_with_dflash2_pass_on_the_gpu():
    from engine import gates
    s = EngineSettings(model="synthetic:tiny-qwen3.5", backend="cupy", parallel=8, context=2048,
                       drafter_model=SYNTHETIC)
    table = gates.run(s, gates.load_chats(None), 12, True, log=lambda m: None, drafted=("dflash2", "oracle"))
    assert gates.passed(table), gates.render(table)
    assert all("drafted == plain: dflash2 (solo, 4 at once, T 1.0)" in col for col in table.values())
