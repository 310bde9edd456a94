"""The prompt cache: a shared prefix is taken from cached pages and gives the cold run's output;
a conversation's next turn goes on from the stream's end as the stream continued would; the
budget holds (LRU), pool pressure evicts, and nothing leaks."""
from dataclasses import replace
from functools import lru_cache

import pytest

from engine.engine import Runner, run_to_end
from engine.events import Started
from engine.settings import EngineSettings, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
LONG = [1] + [16 + (13 * j) % 240 for j in range(400)]


@lru_cache(maxsize=None)
def runner(model: str) -> Runner:
    return Runner(EngineSettings(model=model, backend="numpy", parallel=1, context=1024, memory_gib=1),
                  log=lambda m: None)


def settings(model: str, **kw) -> EngineSettings:
    return EngineSettings(**{**dict(model=model, backend="numpy", parallel=3, context=1024, paging="all",
                                    page_tokens=16, prefill_chunk=32, memory_gib=1, prompt_cache_gib=0.25), **kw})


def run(r: Runner, sched, prompts: list[list[int]], **kw):
    events = []
    seqs = [r.sequence(i, sched.s, None, GREEDY, events.append, p, **kw) for i, p in enumerate(prompts, 1)]
    run_to_end(sched, seqs)
    reused = {e.request_id: e.reused for e in events if isinstance(e, Started)}
    return seqs, reused


def cold(r: Runner, s: EngineSettings, ids: list[int]) -> list[int]:
    off = replace(s, paging="off", prompt_cache_gib=0.0)
    return run(r, r.scheduler(off), [ids])[0][0].tokens


MODELS = ["synthetic:tiny-llama", "synthetic:tiny-qwen3.5"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("paging,dtype", [("all", "bf16"), ("pages", "fp8")])
def test_a_shared_prefix_hit_equals_the_cold_run(model, paging, dtype):
    r = runner(model)
    s = settings(model, paging=paging, kv_dtype=dtype)
    sched = r.scheduler(s)
    first = LONG[:310]
    second = LONG[:300] + [200, 201, 202, 203, 204]
    (a,), reused_a = run(r, sched, [first])
    (b,), reused_b = run(r, sched, [second])
    assert reused_a == {1: 0}
    # Hits land on multiples of max(chunk, page) = 32; the hybrid model keeps its state at the
    # first prompt's last boundary only (288), the pure transformer uses every cached page.
    assert reused_b == {1: 288}
    assert a.tokens == cold(r, s, first) and b.tokens == cold(r, s, second)
    assert sched.prompt_positions == 310 + (305 - 288)
    sched.prompt_cache.clear()
    assert sched.lanes.pool.used == 0


@pytest.mark.parametrize("model", MODELS)
def test_the_next_turn_goes_on_from_the_stream_end(model):
    """History written by decode: the hit gives what the same stream continued gives (its
    snapshot resumed), computing only the new turn."""
    r = runner(model)
    s = settings(model)
    sched = r.scheduler(s)
    seqs, _ = run(r, sched, [LONG[:100]], snapshot_at_end=True)
    snap = sched.snapshots.pop(1)
    nxt = seqs[0].tokens + [40, 41, 42, 43]
    before = sched.prompt_positions
    (hit,), reused = run(r, sched, [nxt])
    assert reused == {1: snap.cache.n} and sched.prompt_positions - before == len(nxt) - snap.cache.n
    (resumed,), _ = run(r, r.scheduler(replace(s, prompt_cache_gib=0.0)), [nxt], resume=snap)
    assert hit.tokens == resumed.tokens


def test_the_budget_holds_and_pool_pressure_evicts():
    """Cached pages are pool pages nobody holds: a stream that needs them evicts them (least
    recently used first) rather than waiting or pausing, and the cache never exceeds its budget."""
    model = "synthetic:tiny-llama"
    r = runner(model)
    page = 16 * r.loaded.config.kv_bytes_per_token("bf16")
    s = settings(model, parallel=2, context=512, memory_gib=(64 * page + page // 2) / 2**30, prompt_cache_gib=1)
    sched = r.scheduler(s)
    assert sched.plan.pool_pages == 64 and sched.plan.prompt_cache_bytes == 64 * page
    prompts = [[1] + [16 + (7 * i + 3 * j) % 240 for j in range(450)] for i in range(4)]
    events = []
    seqs = [r.sequence(i, s, None, GREEDY, events.append, p) for i, p in enumerate(prompts, 1)]
    run_to_end(sched, seqs)
    for q, p in zip(seqs, prompts):
        assert q.tokens == cold(r, s, p)
    assert not [e for e in events if type(e).__name__ == "Queued" and "paused" in e.reason]
    pc = sched.prompt_cache
    assert 0 < pc.nbytes <= sched.plan.prompt_cache_bytes
    assert sched.lanes.pool.used == pc.evictable()  # every page in use is the cache's alone
    pc.clear()
    assert sched.lanes.pool.used == 0


def test_a_budget_of_zero_is_off_and_the_plan_says_what_the_cache_may_take():
    r = runner("synthetic:tiny-llama")
    assert r.scheduler(settings("synthetic:tiny-llama", prompt_cache_gib=0.0)).prompt_cache is None
    plan = r.plan(settings("synthetic:tiny-llama"))
    assert plan.line.endswith(f"prompt cache up to {plan.prompt_cache_bytes / 2**30:.2f} GiB of the pool")
    assert r.plan(settings("synthetic:tiny-llama", paging="off")).prompt_cache_bytes == 0
