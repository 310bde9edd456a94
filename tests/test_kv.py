"""Pages are never leaked nor handed out twice, whatever admit / grow / release sequence runs."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv import Lanes, PagePool


def check(lanes: Lanes) -> None:
    owned = [p for lane in lanes.lanes if not lane.window for p in lane.pages]
    assert len(owned) == len(set(owned)), "a page is in two lanes"
    assert len(owned) == lanes.pool.used
    assert lanes.pool.used + lanes.pool.free == lanes.pool.count
    assert all(lanes.pool.first <= p < lanes.pool.first + lanes.pool.count for p in owned)
    windows = [p for lane in lanes.lanes if lane.window for p in lane.pages]
    assert len(set(windows)) == len(windows) and not set(windows) & set(owned)


ops = st.lists(st.tuples(st.sampled_from(["acquire", "grow", "release"]), st.integers(0, 7), st.integers(1, 600)),
               max_size=80)


@settings(max_examples=150, deadline=None)
@given(mode=st.sampled_from(["off", "pages", "all"]), parallel=st.integers(1, 8), page=st.sampled_from([16, 32, 256]),
       extra=st.integers(0, 40), ops=ops)
def test_random_admit_grow_release_never_leaks(mode, parallel, page, extra, ops):
    context = 512
    W = -(-context // page)
    pool = {"off": 0, "pages": (parallel - 1) * W, "all": parallel * W}[mode]
    pool = min(pool, W + extra) if pool else 0
    lanes = Lanes(parallel, context, page, mode, pool)
    held = []
    for op, i, n in ops:
        if op == "acquire":
            lane = lanes.acquire()
            if lane is not None:
                held.append(lane)
        elif op == "grow" and held:
            lane = held[i % len(held)]
            before = list(lane.pages)
            ok = lanes.ensure(lane, min(n, context))
            if not ok:
                assert lane.pages == before, "a failed grow must take nothing"
        elif op == "release" and held:
            lanes.release(held.pop(i % len(held)))
        check(lanes)
    for lane in held:
        lanes.release(lane)
    check(lanes)
    assert lanes.pool.used == 0


def test_lane_zero_keeps_its_reserve_in_all_mode():
    lanes = Lanes(3, 256, 16, "all", 16 + 8)  # one window (16 pages) for lane 0, 8 more
    own, a = lanes.acquire(), lanes.acquire()
    assert own.index == 0
    assert not lanes.ensure(a, 16 * 9), "lane 1 may not eat into lane 0's reserve"
    assert lanes.ensure(a, 16 * 8)
    assert lanes.ensure(own, 256), "the engine's own lane can always reach a full context"


def test_windows_are_fixed_contiguous_runs():
    lanes = Lanes(3, 100, 16, "pages", 14)
    own = lanes.acquire()
    assert own.window and own.pages == list(range(7))
    assert lanes.pool.first == 7
    other = lanes.acquire()
    assert lanes.ensure(other, 20) and other.pages == [7, 8]
    np.testing.assert_array_equal(lanes.table(other)[:2], [7, 8])


def test_pool_refuses_double_release():
    pool = PagePool(0, 4)
    p = pool.alloc()
    pool.release([p])
    with pytest.raises(ValueError):
        pool.release([p])
