"""The cache: one page formula, snapshots that land bit for bit in any lane, one cache per scheduler."""
import numpy as np
import pytest

from engine.engine import Runner, run_to_end
from engine.errors import PlanError
from engine.kv import Cache, Lanes
from engine.kv.cache import F32, slots
from engine.ops.numpy_backend import NumpyBackend
from engine.settings import EngineSettings, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def settings(model: str = "synthetic:tiny-qwen3.5", **kw) -> EngineSettings:
    return EngineSettings(**{**dict(model=model, backend="numpy", parallel=3, context=256, paging="all",
                                    page_tokens=16, memory_gib=1), **kw})


@pytest.fixture(scope="module")
def hybrid() -> Runner:
    return Runner(settings(), log=lambda m: None)


def fill_random(cache: Cache, rng) -> None:
    """Random bits in every K/V page and recurrent slot (fp8 scales positive, as written ones are)."""
    for group in ([cache.k, cache.v] + ([cache.k_scale, cache.v_scale] if cache.dtype == "fp8" else [])):
        for a in group:
            if a.dtype == np.float32:
                a[...] = rng.uniform(0.01, 3, a.shape)
            else:
                a[...] = rng.integers(0, np.iinfo(a.dtype).max, a.shape, dtype=a.dtype)
    for group in cache.state:
        for a in group:
            a[...] = rng.normal(size=a.shape)


def test_slots_are_the_page_table_arithmetic():
    lanes = Lanes(2, 100, 16, "all", 14)
    a, b = lanes.acquire(), lanes.acquire()
    assert lanes.ensure(b, 20) and lanes.ensure(a, 40)  # b takes pages 0, 1; a 2, 3, 4
    pos = np.array([0, 15, 16, 39])
    tables = np.stack([lanes.table(a)] * 4)
    assert slots(tables, pos, 16).tolist() == [2 * 16, 2 * 16 + 15, 3 * 16, 4 * 16 + 7]


@pytest.mark.parametrize("kv", ["bf16", "fp8", F32])
def test_a_snapshot_lands_bit_for_bit_in_another_lane(hybrid, kv):
    sched = hybrid.scheduler(settings(kv_dtype="bf16" if kv == F32 else kv), F32 if kv == F32 else None)
    cache, lanes = sched.cache, sched.lanes
    fill_random(cache, np.random.default_rng(1))
    a, b, c = lanes.acquire(), lanes.acquire(), lanes.acquire()
    assert lanes.ensure(b, 30) and lanes.ensure(a, 41) and lanes.ensure(c, 41)  # a partial last page
    assert not set(c.pages) & set(a.pages)
    snap = cache.read(a, 41)
    assert snap.kv_dtype == kv and len(snap.kv) == 2 and len(snap.state) == 6
    assert snap.kv[0][0].shape == (41, 2, 16) and snap.nbytes > 0
    neighbour = cache.read(b, 30)
    cache.write(c, snap)
    for moved, saved in ((cache.read(c, 41), snap), (cache.read(b, 30), neighbour)):
        for got, want in zip(moved.kv + moved.state, saved.kv + saved.state):
            assert all(np.array_equal(g.view(np.uint8), w.view(np.uint8)) for g, w in zip(got, want))


def test_a_snapshot_lands_in_a_lane_of_scattered_pages(hybrid):
    """Pages taken in turns by two lanes (a fragmented pool): each lane is runs of consecutive
    rows, the runs are exactly its rows, and a write touches no row of the other lane."""
    sched = hybrid.scheduler(settings())
    cache, lanes = sched.cache, sched.lanes
    fill_random(cache, np.random.default_rng(3))
    a, b, c = lanes.acquire(), lanes.acquire(), lanes.acquire()
    assert lanes.ensure(a, 50)
    for n in (16, 32, 33, 48):
        assert lanes.ensure(b, n) and lanes.ensure(c, n)
    assert lanes.ensure(b, 60) and lanes.ensure(c, 60)  # b and c take their 4 pages in turns
    assert cache.runs(a, 50) == [(0, 0, 50)]  # pages 0-3: one run, its last page partial
    runs = cache.runs(c, 50)
    assert len(runs) == 4 and sum(size for _, _, size in runs) == 50
    assert np.concatenate([np.arange(row, row + size) for _, row, size in runs]).tolist() == cache.rows(c, 50).tolist()
    snap, neighbour = cache.read(a, 50), cache.read(b, 60)
    cache.write(c, snap)
    for moved, saved in ((cache.read(c, 50), snap), (cache.read(b, 60), neighbour)):
        for got, want in zip(moved.kv + moved.state, saved.kv + saved.state):
            assert all(np.array_equal(g.view(np.uint8), w.view(np.uint8)) for g, w in zip(got, want))


def test_a_state_goes_to_the_host_array_by_array(hybrid):
    """`on_host` (a restore may land its arrays on the device) keeps every array's bits and place."""
    sched = hybrid.scheduler(settings())
    fill_random(sched.cache, np.random.default_rng(2))
    lane = sched.lanes.acquire()
    assert sched.lanes.ensure(lane, 20)
    snap = sched.cache.read(lane, 20)
    moved = []
    back = snap.on_host(lambda a: moved.append(a) or np.array(a))
    assert len(moved) == sum(len(g) for g in snap.kv + snap.state + [snap.ring])
    assert (back.n, back.kv_dtype) == (snap.n, snap.kv_dtype)
    assert (len(back.kv), len(back.state)) == (len(snap.kv), len(snap.state))
    for got, want in zip(back.kv + back.state, snap.kv + snap.state):
        assert all(g is not w and np.array_equal(g, w) for g, w in zip(got, want))


def test_a_snapshot_is_refused_where_it_does_not_fit(hybrid):
    sched = hybrid.scheduler(settings())
    lane = sched.lanes.acquire()
    assert sched.lanes.ensure(lane, 20)
    snap = sched.cache.read(lane, 20)
    other = sched.lanes.acquire()
    with pytest.raises(ValueError, match="holds pages for 0 positions"):
        sched.cache.write(other, snap)
    fp8 = hybrid.scheduler(settings(kv_dtype="fp8"))
    lane8 = fp8.lanes.acquire()
    assert fp8.lanes.ensure(lane8, 20)
    with pytest.raises(ValueError, match="bf16 K/V, the cache stores fp8"):
        fp8.cache.write(lane8, snap)
    llama = Runner(settings("synthetic:tiny-llama"), log=lambda m: None).scheduler(settings("synthetic:tiny-llama"))
    lane_l = llama.lanes.acquire()
    assert llama.lanes.ensure(lane_l, 20)
    with pytest.raises(ValueError, match="recurrent layers"):
        llama.cache.write(lane_l, snap)


def test_two_schedulers_never_share_state(hybrid):
    """A second scheduler of the same runner has its own cache: running it leaves the first's alone."""
    first, second = hybrid.scheduler(settings()), hybrid.scheduler(settings())
    assert first.cache is not second.cache
    fill_random(first.cache, np.random.default_rng(2))
    before = [a.copy() for group in first.cache.state for a in group] + [a.copy() for a in first.cache.k]
    seq = hybrid.sequence(1, settings(), None, GREEDY, lambda e: None, list(range(20, 60)))
    run_to_end(second, [seq])
    after = [a for group in first.cache.state for a in group] + list(first.cache.k)
    assert all(np.array_equal(x, y) for x, y in zip(before, after))
    assert any(a.any() for group in second.cache.state for a in group)


def test_a_cache_beyond_free_memory_is_refused_before_allocation():
    b = NumpyBackend()
    pages = b.free_memory() // (16 * 8 * 128 * 2 * 2) + 10
    with pytest.raises(PlanError, match="memory-gib"):
        Cache(b, layers=1, pages=pages, page_tokens=16, kv_heads=8, head_dim=128, kv_dtype="bf16", lanes=1)


def test_a_store_the_backend_lacks_is_refused():
    class Bf16Only(NumpyBackend):
        kv_stores = ("bf16",)
    with pytest.raises(PlanError, match="does not store fp8"):
        Cache(Bf16Only(), layers=1, pages=2, page_tokens=16, kv_heads=1, head_dim=16, kv_dtype="fp8", lanes=1)
