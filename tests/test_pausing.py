"""Pool pressure: every stream finishes, exactly as alone, with no page leaked, whatever the pool.

Streams that cannot place their next piece wait; when nobody can, the youngest pauses to host
memory and later continues bit for bit; lane 0 lends its reserve while idle and takes it back.
"""
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.engine import Runner, run_to_end
from engine.events import Queued
from engine.plan import GIB
from engine.settings import EngineSettings, SamplingParams

STALL_LIMIT = 1000  # steps without a computed position: the property says this never happens


@lru_cache(maxsize=None)
def runner(model: str = "synthetic:tiny-llama") -> Runner:
    return Runner(EngineSettings(model=model, backend="numpy", parallel=1, context=512, memory_gib=1),
                  log=lambda m: None)


def prompt(i: int, n: int) -> list[int]:
    return [1] + [16 + (31 * i + 7 * j) % 250 for j in range(n - 1)]


def arm(model: str, paging: str, page: int, dtype: str, context: int, parallel: int, pool_pages: int,
        chunk: int = 64, cache_pages: int = 0) -> EngineSettings:
    """Settings whose pool holds exactly `pool_pages` pages, `cache_pages` of them for the prompt cache."""
    cfg = runner(model).loaded.config
    page_bytes = page * cfg.kv_bytes_per_token(dtype)
    window = -(-context // page) * page_bytes if paging == "pages" else 0
    state = (2 * parallel + 1) * cfg.state_bytes_per_stream()
    budget = window + state + pool_pages * page_bytes + page_bytes // 2
    return EngineSettings(model=model, backend="numpy", parallel=parallel, context=context, kv_dtype=dtype,
                          paging=paging, page_tokens=page, prefill_chunk=chunk, memory_gib=budget / GIB,
                          prompt_cache_gib=cache_pages * page_bytes / GIB)


@lru_cache(maxsize=None)
def solo(model: str, dtype: str, ids: tuple[int, ...], reply: int) -> tuple[int, ...]:
    """The stream alone in a contiguous window: the reference every arm must reproduce."""
    r = runner(model)
    s = EngineSettings(model=model, backend="numpy", parallel=1, context=512, kv_dtype=dtype, paging="off",
                       prefill_chunk=64, memory_gib=1)
    seq = r.sequence(1, s, None, greedy(reply), lambda e: None, list(ids))
    run_to_end(r.scheduler(s), [seq])
    return tuple(seq.tokens)


def greedy(reply: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=reply, ignore_eos=True)


def drive(model: str, s: EngineSettings, requests: list[tuple[int, int, int]], watch=None, families: int = 0):
    """Run requests (prompt length, reply length, arrival step) to the end, checking progress on
    every step; returns (sequences, steps, events, scheduler). With `families`, prompts share
    prefixes (prompt i is a prefix of any longer one of the same family i % families)."""
    r = runner(model)
    sched = r.scheduler(s)
    events = []
    seqs = [r.sequence(i, s, None, greedy(reply), events.append, prompt(i % families if families else i, n))
            for i, (n, reply, _) in enumerate(requests, 1)]
    arrivals = sorted(zip((a for _, _, a in requests), range(len(seqs))))
    work = sum(-(-n // s.prefill_chunk) + reply for n, reply, _ in requests)
    bound = 2 * work + max(a for a, _ in arrivals) + 2 * s.parallel + 4
    steps = stalled = 0
    mark = -1
    while arrivals or sched.busy:
        while arrivals and arrivals[0][0] <= steps:
            sched.add(seqs[arrivals.pop(0)[1]])
        if sched.busy:
            sched.step()
            if watch is not None:
                watch(sched)
        steps += 1
        done = sched.prompt_positions + sched.decode_positions
        stalled = 0 if done != mark else stalled + 1
        mark = done
        assert stalled < STALL_LIMIT, f"{STALL_LIMIT} steps without progress"
        assert steps <= bound, f"{steps} steps for {work} pieces of work"
    return seqs, steps, events, sched


def check(model: str, s: EngineSettings, requests, seqs, sched) -> None:
    for seq, (n, reply, _) in zip(seqs, requests):
        assert tuple(seq.tokens) == solo(model, s.kv_dtype, tuple(seq.tokens[:n]), reply)
    assert not any(lane.busy for lane in sched.lanes.lanes)
    if sched.prompt_cache is not None:  # what stays in use is the cache's alone, within its budget
        assert sched.lanes.pool.used == sched.prompt_cache.evictable()
        assert sched.prompt_cache.nbytes <= sched.plan.prompt_cache_bytes
        sched.prompt_cache.clear()
    assert sched.lanes.pool.used == 0


@st.composite
def configs(draw):
    paging = draw(st.sampled_from(["pages", "all"]))
    page = draw(st.sampled_from([16, 32, 64]))
    context = draw(st.sampled_from([256, 384, 512]))
    parallel = draw(st.integers(1, 8))
    W = -(-context // page)
    pool_lanes = parallel - (paging == "pages")
    most = max(W, pool_lanes * W)
    pool = draw(st.integers(W, min(most, W + 3 * W // 2)))
    if paging == "pages" and parallel == 1:
        pool = 0
    cache = draw(st.sampled_from([0, 0, W // 2, 2 * W]))
    s = arm("synthetic:tiny-llama", paging, page, draw(st.sampled_from(["bf16", "fp8"])), context, parallel, pool,
            cache_pages=cache)
    n = draw(st.integers(1, 8))
    requests = []
    for _ in range(n):
        reply = draw(st.integers(1, 10))
        length = draw(st.integers(1, context - reply - 1))
        requests.append((length, reply, draw(st.integers(0, 12))))
    return s, requests, draw(st.integers(0, 3))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(configs())
def test_every_stream_finishes_exactly_under_any_pool(config):
    """Prompt families share prefixes; with a prompt cache, hits must still give the solo output."""
    s, requests, families = config
    seqs, _, _, sched = drive("synthetic:tiny-llama", s, requests, families=families)
    check("synthetic:tiny-llama", s, requests, seqs, sched)


def test_prompt_readers_that_each_need_a_page_no_longer_hang():
    """`all`, page 64, fp8, context 512, a pool of 12 pages with 8 free (the engine's own
    reserve, its lane idle), four streams at 64 of 113–207 prompt tokens, each needing one more."""
    s = arm("synthetic:tiny-llama", "all", 64, "fp8", 512, 5, 12)
    assert runner().plan(s).pool_pages == 12
    requests = [(10, 2, 0), (113, 8, 0), (150, 8, 0), (180, 8, 0), (207, 8, 0)]
    seen = []

    def watch(sched):
        readers = [q for q in sched.active if not q.prompt_done]
        if (not sched.lanes.lanes[0].busy and sched.lanes.pool.free == 8 and len(readers) == 4
                and all(q.computed == 64 for q in readers)):
            seen.append(True)
    seqs, _, _, sched = drive("synthetic:tiny-llama", s, requests, watch)
    assert seen, "the configuration of the report was reached"
    check("synthetic:tiny-llama", s, requests, seqs, sched)


def test_a_hit_whose_tail_copy_evicts_its_own_entry_keeps_its_pages():
    """A pool of 13 pages and a cache of one page: copying a stream end's tail page needs a page, and
    the eviction that frees one dropped the very entry being taken (found by the property above)."""
    s = EngineSettings(model="synthetic:tiny-llama", backend="numpy", parallel=3, context=256, paging="all",
                       page_tokens=32, prefill_chunk=64, memory_gib=0.000103, prompt_cache_gib=3.05e-5)
    requests = [(97, 1, 2), (65, 1, 3), (1, 1, 0), (224, 3, 1), (66, 1, 3)]
    seqs, _, _, sched = drive("synthetic:tiny-llama", s, requests, families=1)
    assert runner().plan(s).pool_pages == 13 and sched.prompt_cache.hits >= 1
    check("synthetic:tiny-llama", s, requests, seqs, sched)


def test_lane_zero_takes_its_reserve_back_by_pausing_a_borrower():
    """The borrowers run on lane 0's reserve while it is idle; a newcomer on lane 0 pauses them."""
    s = arm("synthetic:tiny-llama", "all", 16, "bf16", 256, 3, 16 + 8)
    requests = [(8, 1, 0), (100, 40, 0), (100, 40, 0), (200, 8, 5)]
    seqs, _, events, sched = drive("synthetic:tiny-llama", s, requests)
    paused = [e for e in events if isinstance(e, Queued) and e.reason.startswith("paused")]
    assert any("reserve" in e.reason for e in paused)
    check("synthetic:tiny-llama", s, requests, seqs, sched)


@pytest.mark.parametrize("requests", [
    [(10, 3, 0), (150, 4, 0), (150, 4, 0)],  # stuck mid-prompt: the younger reader pauses
    [(10, 3, 0), (100, 40, 0), (100, 40, 0)],  # stuck mid-reply: the younger decoder pauses
])
def test_hybrid_streams_pause_with_their_recurrent_state(requests):
    """DeltaNet state goes to the host and back with the K/V rows: a paused Qwen3.5 stream,
    mid-prompt or mid-reply, continues exactly."""
    model = "synthetic:tiny-qwen3.5"
    s = arm(model, "pages", 16, "bf16", 256, 3, 16)
    seqs, _, events, sched = drive(model, s, requests)
    assert [e.request_id for e in events if isinstance(e, Queued) and e.reason.startswith("paused")] == [3]
    check(model, s, requests, seqs, sched)
