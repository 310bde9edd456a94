"""Verify windows: drafted == plain token for token, and the acceptance edge cases (first draft
rejected, all accepted, EOS and the token limit inside the window, windows across page boundaries,
the context limit inside the window, a drafter that fails mid-stream)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.drafters import Drafter
from engine.drafters.oracle import OracleDrafter
from engine.drafters.verify import OFF, Verifier, accepted
from engine.engine import Runner, run_to_end
from engine.settings import EngineSettings, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
HOT = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=24, seed=99, ignore_eos=True)
_RUNNERS: dict[str, Runner] = {}


class Scripted(Drafter):
    """Proposes what `fn(seq, k)` says: the tests' way to reject, accept or fail on purpose."""
    name = "scripted"

    def __init__(self, fn):
        self.fn, self.proposed = fn, 0

    def propose(self, seq, k):
        out = self.fn(seq, k)
        self.proposed += len(out)
        return out


def runner(name: str) -> Runner:
    if name not in _RUNNERS:
        _RUNNERS[name] = Runner(settings(name), log=lambda m: None)
    return _RUNNERS[name]


def settings(name: str, **kw) -> EngineSettings:
    base = dict(model=f"synthetic:{name}", backend="numpy", parallel=4, context=256, paging="all", page_tokens=16)
    base.update(kw)
    return EngineSettings(**base)


def prompts(n: int = 3) -> list[list[int]]:
    return [[1] + [16 + (i * 7 + j * 3) % 50 for j in range(11 + 6 * i)] for i in range(n)]


def run(r: Runner, s: EngineSettings, ps, params=GREEDY, drafter: Drafter | None = None, k: int = 3,
        snapshot: bool = False):
    """Sequences after running `ps` together; with a drafter, in verify windows of k drafts."""
    if drafter is not None:
        s = replace(s, drafter="oracle", draft_tokens=k)  # the plan of a k-draft window
    sched = r.scheduler(s)
    if drafter is not None:
        sched.verifier = Verifier(sched, drafter, k)
    seqs = [r.sequence(i + 1, s, None, params, lambda e: None, p, snapshot_at_end=snapshot) for i, p in enumerate(ps)]
    done = run_to_end(sched, seqs)
    return seqs, done, sched


def test_accepted_counts_the_matching_prefix():
    assert accepted([], [5]) == 0
    assert accepted([5, 6, 7], [5, 6, 7, 8]) == 3
    assert accepted([5, 6, 7], [4, 6, 7, 8]) == 0
    assert accepted([5, 9, 7], [5, 6, 7, 8]) == 1


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3.5"])
@pytest.mark.parametrize("params", [GREEDY, HOT], ids=["greedy", "T1"])
def test_every_draft_accepted_and_every_first_draft_rejected(name, params):
    r = runner(name)
    s = settings(name)
    plain, _, _ = run(r, s, prompts(), params)
    oracle = OracleDrafter([q.tokens for q in plain])
    counted = Scripted(oracle.propose)
    full, _, _ = run(r, s, prompts(), params, counted)
    assert [q.tokens for q in full] == [q.tokens for q in plain]
    assert sum(q.stats.accepted for q in full) == counted.proposed > 0  # every draft accepted
    assert all(q.stats.mean_length > 3.5 for q in full)  # windows of 4, the last one shorter

    def wrong(seq, k):  # the plain run's next tokens, each shifted: never accepted
        run_ = next(p.tokens for p in plain if p.tokens[:seq.prompt_len] == seq.tokens[:seq.prompt_len])
        return [(t + 1) % 272 for t in run_[len(seq.tokens):len(seq.tokens) + k]]
    rejected, _, _ = run(r, s, prompts(), params, Scripted(wrong))
    assert [q.tokens for q in rejected] == [q.tokens for q in plain]
    assert all(q.stats.windows > 10 and q.stats.accepted == 0 for q in rejected)


def test_partial_acceptance_with_recurrent_state_and_padded_streams():
    """Drafts right for i tokens then wrong, different per stream, one stream never drafting (its
    window pads to the scratch page): the DeltaNet state of the last accepted row is kept."""
    name = "tiny-qwen3.5"
    r, s = runner(name), settings(name)
    plain, _, _ = run(r, s, prompts(4))
    runs = {q.id: q.tokens for q in plain}

    def some(seq, k):
        if seq.id == 2:
            return []
        nxt = runs[seq.id][len(seq.tokens):len(seq.tokens) + k]
        cut = (len(seq.tokens) + seq.id) % (k + 1)
        return nxt[:cut] + [(t + 3) % 272 for t in nxt[cut:]]
    seqs, _, _ = run(r, s, prompts(4), GREEDY, Scripted(some), k=4)
    assert [q.tokens for q in seqs] == [q.tokens for q in plain]
    assert seqs[1].stats.windows == 0
    assert all(0 < q.stats.accepted < 4 * q.stats.windows for i, q in enumerate(seqs) if i != 1)


def eos_case(name: str, snapshot: bool):
    r, s = runner(name), settings(name, parallel=1)
    long, _, _ = run(r, s, prompts(1))
    gen = long[0].tokens[long[0].prompt_len:]
    # A first occurrence that a full window of 7 (after the prompt's token) takes as a draft, drafts after it
    stop = next(t for i, t in enumerate(gen) if i >= 5 and (i - 1) % 7 < 6 and t not in gen[:i])
    params = replace(GREEDY, ignore_eos=False)
    tok = r.tokenizer
    old = tok.eos_ids
    tok.eos_ids = {stop}
    try:
        plain, pdone, psched = run(r, s, prompts(1), params, snapshot=snapshot)
        drafted, ddone, dsched = run(r, s, prompts(1), params, OracleDrafter([long[0].tokens]), k=6, snapshot=snapshot)
    finally:
        tok.eos_ids = old
    return plain[0], pdone[1], psched, drafted[0], ddone[1], dsched, stop


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3.5"])
def test_eos_inside_the_window_ends_the_stream_where_plain_does(name):
    plain, pdone, psched, drafted, ddone, dsched, stop = eos_case(name, snapshot=True)
    assert drafted.tokens == plain.tokens and drafted.tokens[-1] == stop
    assert ddone.reason == pdone.reason == "eos" and ddone.tokens == pdone.tokens
    assert drafted.stats.windows > 0
    a, b = psched.snapshots[1].cache, dsched.snapshots[1].cache  # the state plain decoding leaves
    assert a.n == b.n
    for x, y in zip(a.kv + a.state, b.kv + b.state):
        for u, v in zip(x, y):
            assert np.array_equal(u, v)


def test_token_limit_inside_the_window():
    name = "tiny-qwen3.5"
    r, s = runner(name), settings(name)
    params = replace(GREEDY, max_tokens=7)  # 1 + windows of 4 rows: the limit falls inside one
    plain, _, _ = run(r, s, prompts(), params)
    oracle = OracleDrafter([q.tokens for q in run(r, s, prompts())[0]])
    seqs, done, _ = run(r, s, prompts(), params, oracle, k=4)
    assert [q.tokens for q in seqs] == [q.tokens for q in plain]
    assert all(q.generated == 7 and d.reason == "length" for q, d in zip(seqs, done.values()))


@pytest.mark.parametrize("paging", ["pages", "all", "off"])
def test_windows_across_page_boundaries(paging):
    """Prompts of 13..15 tokens on 16-token pages: the first windows straddle the page boundary."""
    name = "tiny-qwen3.5"
    r, s = runner(name), settings(name, paging=paging, page_tokens=16)
    ps = [[1] + [16 + (j * 5 + i) % 40 for j in range(12 + i)] for i in range(3)]
    plain, _, _ = run(r, s, ps)
    seqs, _, _ = run(r, s, ps, GREEDY, OracleDrafter([q.tokens for q in plain]), k=5)
    assert [q.tokens for q in seqs] == [q.tokens for q in plain]


def test_context_limit_inside_the_window():
    name = "tiny-llama"
    r, s = runner(name), settings(name, context=40)
    ps = [[1] + [16 + j % 30 for j in range(28)]]
    params = replace(GREEDY, max_tokens=100)
    plain, pdone, _ = run(r, s, ps, params)
    assert len(plain[0].tokens) == 40 and pdone[1].reason == "length"
    seqs, done, _ = run(r, s, ps, params, OracleDrafter([plain[0].tokens + [20] * 10]), k=7)
    assert seqs[0].tokens == plain[0].tokens and done[1].reason == "length"


def test_a_failing_drafter_falls_back_to_plain_for_that_stream(capsys):
    name = "tiny-qwen3.5"
    r, s = runner(name), settings(name)
    plain, _, _ = run(r, s, prompts())
    runs = {q.id: q.tokens for q in plain}

    def flaky(seq, k):
        if seq.id == 1 and len(seq.tokens) > seq.prompt_len + 6:
            raise RuntimeError("the drafter broke")
        if seq.id == 3:
            return [10 ** 6]  # not a token of this vocabulary
        return runs[seq.id][len(seq.tokens):len(seq.tokens) + k]
    seqs, done, _ = run(r, s, prompts(), GREEDY, Scripted(flaky))
    assert [q.tokens for q in seqs] == [q.tokens for q in plain]
    assert seqs[0].draft == OFF and seqs[2].draft == OFF and seqs[1].draft != OFF
    err = capsys.readouterr().err
    assert "request 1 (RuntimeError: the drafter broke); that stream continues without drafts" in err
    assert "request 3 (ValueError: a draft token outside the vocabulary" in err
    assert all(d.reason == "length" for d in done.values())
