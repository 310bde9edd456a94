"""The DFlash2 drafter: its block against a float64 reference of z-lab's equations (context ring
with a sliding window, dynamic convs, candidate selector), the ring it keeps in the cache (what a
chunked context, windows with and without rejections, a pause and a file leave there), drafted ==
plain with it, and what the plan counts."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from engine.drafters.dflash2 import DFlash2Drafter
from engine.drafters.dflash2_config import SYNTHETIC, synthetic_config
from engine.drafters.dflash2_weights import random_tensors
from engine.drafters.oracle import OracleDrafter
from engine.drafters.verify import OFF, Verifier
from engine.engine import Runner, run_to_end
from engine.kv import snapshots
from engine.kv.cache import ring_bytes
from engine.settings import EngineSettings, SamplingParams
from engine.weights import dequantize

import reference
from ckpt import write_dflash2

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
HOT = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=40, seed=7, ignore_eos=True)
_RUNNERS: dict[str, Runner] = {}


def settings(name: str = "tiny-qwen3.5", **kw) -> EngineSettings:
    base = dict(model=f"synthetic:{name}", backend="numpy", parallel=4, context=256, paging="all", page_tokens=16,
                drafter="dflash2", drafter_model=SYNTHETIC, draft_tokens=7)
    base.update(kw)
    return EngineSettings(**base)


def runner(name: str = "tiny-qwen3.5") -> Runner:
    if name not in _RUNNERS:
        _RUNNERS[name] = Runner(settings(name), log=lambda m: None)
    return _RUNNERS[name]


def prompts(n: int = 3) -> list[list[int]]:
    return [[1] + [16 + (i * 11 + j * 5) % 60 for j in range(13 + 23 * i)] for i in range(n)]


def run(r: Runner, s: EngineSettings, ps, params=GREEDY, drafter=None, snapshot=False, first=()):
    """Sequences after running `first` then `ps` together (ids 1.., then 100..), `drafter` replacing
    the scheduler's own."""
    sched = r.scheduler(s)
    if drafter is not None:
        sched.verifier = Verifier(sched, drafter(sched), s.draft_tokens)
    seqs = [r.sequence(100 + i, s, None, params, lambda e: None, p) for i, p in enumerate(first)]
    seqs += [r.sequence(i + 1, s, None, params, lambda e: None, p, snapshot_at_end=snapshot)
             for i, p in enumerate(ps)]
    done = run_to_end(sched, seqs)
    return seqs[len(first):], done, sched


class Recording(DFlash2Drafter):
    """The DFlash2 drafter as it is, keeping what it proposed: (request, tokens so far) → drafts;
    `oracle` (runs to follow) proposes those instead, so every draft is accepted."""

    def __init__(self, sched, oracle: list[list[int]] | None = None):
        real = sched.verifier.drafter
        super().__init__(real.w, real.model, real.b)
        self.proposed: dict[tuple[int, int], list[int]] = {}
        self.oracle = OracleDrafter(oracle or [])
        self.use_oracle = oracle is not None

    def propose(self, seq, k):
        out = super().propose(seq, k)
        self.proposed[(seq.id, len(seq.tokens))] = out
        return self.oracle.propose(seq, k) if self.use_oracle else out


# --- the block against float64 ------------------------------------------------------------------
def reference_block(cfg, W: dict, E: np.ndarray, taps: np.ndarray, anchor: int) -> np.ndarray:
    """float64 rows 1..B-1 of the final-normed block after context taps [T, n·H] (positions 0..T-1),
    the block at T..T+B-1: every context position within the window, no ring."""
    T, B, H = len(taps), cfg.block, cfg.hidden
    nh, kvh, hd = cfg.heads, cfg.kv_heads, cfg.head_dim

    def norm(x, w):
        return reference.rms_norm(x, w, cfg.rms_eps)

    def conv(h, dyn, base):
        d = np.repeat(dyn.reshape(B, cfg.conv_kernel, H // cfg.conv_group), cfg.conv_group, axis=2)
        y = np.zeros_like(h)
        for t in range(B):
            for o in range(min(cfg.conv_kernel, t + 1)):
                y[t] += (base[o] + d[t, o]) * h[t - o]
        return y

    ctx = norm(taps @ W["fc"].T, W["hidden_norm"])
    x = E[[anchor] + [cfg.mask_id] * (B - 1)] * cfg.embed_scale
    for i in range(cfg.layers):
        pre, a = f"layers.{i}.", f"layers.{i}.self_attn."

        def before(h, which):
            dyn = h @ W[pre + which + ".kernel_projection"].T
            base = W[pre + which + ".base_kernel"]
            return conv(h, dyn[:, :dyn.shape[1] // 2], base[0]), (dyn[:, dyn.shape[1] // 2:], base[1])

        def kv(src, start):
            k = norm((src @ W[a + "k_proj"].T).reshape(len(src), kvh, hd), W[a + "k_norm"])
            return reference.rope(k, cfg.rope_theta, hd, start), (src @ W[a + "v_proj"].T).reshape(len(src), kvh, hd)
        h, after = before(norm(x, W[pre + "input_layernorm"]), "attention_conv")
        q = reference.rope(norm((h @ W[a + "q_proj"].T).reshape(B, nh, hd), W[a + "q_norm"]), cfg.rope_theta, hd, T)
        (kc, vc), (kb, vb) = kv(ctx, 0), kv(h, T)
        rows = T + np.arange(B)[:, None]
        seen = np.arange(T)[None, :] > rows - cfg.windows[i] if cfg.windows[i] else np.ones((B, T), bool)
        mask = np.concatenate([seen, np.ones((B, B), bool)], 1)
        o = reference.attention(q, np.concatenate([kc, kb]), np.concatenate([vc, vb]), mask) @ W[a + "o_proj"].T
        x = x + conv(o, *after)
        h, after = before(norm(x, W[pre + "post_attention_layernorm"]), "mlp_conv")
        g, u = h @ W[pre + "mlp.gate_proj"].T, h @ W[pre + "mlp.up_proj"].T
        x = x + conv((g / (1 + np.exp(-g)) * u) @ W[pre + "mlp.down_proj"].T, *after)
    return norm(x, W["norm"])[1:]


def reference_drafts(cfg, W: dict, logits: np.ndarray, out: np.ndarray, anchor: int, k: int) -> list[int]:
    """The candidate selector's greedy path over the top-k of the scaled, softcapped logits."""
    z = np.tanh(logits * cfg.output_multiplier / cfg.softcap) * cfg.softcap
    proj = out @ W["candidate_selector.hidden_projection"].T
    pred, succ = W["candidate_selector.predecessor_codebook"], W["candidate_selector.successor_codebook"]
    path, prev = [], anchor
    for i in range(k):
        cand = np.argsort(-z[i], kind="stable")[:cfg.selector_top_k]
        prev = int(cand[np.argmax(z[i][cand] + succ[cand] @ (pred[prev] * proj[i]))])
        path.append(prev)
    return path


@pytest.mark.parametrize("windows", [(48, 48), (48, None)], ids=["sliding", "one-layer-whole-context"])
def test_block_and_drafts_match_the_float64_reference(windows, tmp_path):
    """70 context positions fed in three chunks: past the window of 48 (the ring wraps), or with a
    layer that attends the whole context (the ring is the context)."""
    r = runner()
    cfg = replace(synthetic_config(r.loaded.config), windows=windows)
    write_dflash2(tmp_path, r.loaded.config, cfg=cfg, dtype="f32")  # the synthetic drafter's weights
    sched = r.scheduler(settings(drafter_model=str(tmp_path)))
    d = sched.verifier.drafter
    assert d.cfg == cfg and sched.cache.ring_len == (48 if None not in windows else 256)
    W = {n: a.astype(np.float64) for n, a in random_tensors(cfg).items()}
    E = dequantize(r.loaded.weights["embed_tokens"]).astype(np.float64)
    head = dequantize(r.loaded.weights["lm_head"]).astype(np.float64)
    T, anchor = 70, 33
    taps = np.random.default_rng(5).normal(0, 2, (T, len(cfg.target_layers) * cfg.hidden)).astype(np.float32)
    lane = sched.lanes.acquire()
    sched.cache.reset(lane.index)
    seq = SimpleNamespace(lane=lane)
    for a, b in ((0, 30), (30, 55), (55, 70)):
        d.observe(seq, a, taps[a:b])
    held = np.asarray(sched.cache.ring_pos[lane.index])
    assert sorted(held[held >= 0].tolist()) == list(range(T - sched.cache.ring_len if None not in windows else 0, T))
    out = np.asarray(d.block(anchor, T, lane.index))
    ref = reference_block(cfg, W, E, taps.astype(np.float64), anchor)
    assert np.abs(out - ref).max() <= 2e-3 * np.abs(ref).max()  # the ring's K/V are fp16
    logits = np.asarray(r.model.head(out), np.float64)
    assert np.abs(logits - ref @ head.T).max() <= 2e-3 * np.abs(logits).max()
    assert d.choose(out, anchor, 7) == reference_drafts(cfg, W, logits, out.astype(np.float64), anchor, 7)
    assert d.choose(out, anchor, 3) == d.choose(out, anchor, 7)[:3]
    # the same context in one piece leaves the same ring, bit for bit
    other = sched.lanes.acquire()
    sched.cache.reset(other.index)
    d.observe(SimpleNamespace(lane=other), 0, taps)
    for layer in sched.cache.ring_k + sched.cache.ring_v + [sched.cache.ring_pos]:
        assert np.array_equal(layer[lane.index], layer[other.index])


# --- drafted == plain ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,paging,page,params", [
    ("tiny-qwen3.5", "off", 256, GREEDY), ("tiny-qwen3.5", "all", 16, GREEDY), ("tiny-qwen3.5", "all", 16, HOT),
    ("tiny-qwen3.5-moe", "pages", 16, GREEDY), ("tiny-qwen3.5-moe", "off", 256, HOT)],
    ids=["contiguous", "all-p16", "all-p16-T1", "moe-pages-p16", "moe-contiguous-T1"])
def test_drafted_equals_plain_solo_and_together(name, paging, page, params):
    r, s = runner(name), settings(name, paging=paging, page_tokens=page)
    params = replace(params, max_tokens=24)
    plain, _, _ = run(r, replace(s, drafter="none"), prompts(), params)
    together, _, _ = run(r, s, prompts(), params)
    assert [q.tokens for q in together] == [q.tokens for q in plain]
    solo = run(r, s, prompts()[1:2], params)[0][0]
    assert solo.tokens == plain[1].tokens
    windows = sum(q.stats.windows for q in together)
    assert windows > 20 and sum(q.stats.accepted for q in together) < windows  # random weights: rejections
    if paging == "all":  # 16-token pages: windows cross page boundaries
        assert any(len(p) % 16 > 16 - 8 for p in prompts())


def test_ring_after_windows_holds_what_the_same_tokens_as_a_prompt_leave():
    """Whatever was accepted (every draft, or few of them), the ring ends as a prompt of the same
    tokens leaves it: every row the target computed reached it, none that it rejected."""
    r, s = runner(), settings()
    plain, _, _ = run(r, replace(s, drafter="none"), prompts(2))
    for oracle in ([q.tokens for q in plain], None):
        seqs, _, sched = run(r, s, prompts(2), drafter=lambda sc: Recording(sc, oracle), snapshot=True)
        assert all(q.stats.mean_length > 6 for q in seqs) if oracle else all(q.stats.mean_length < 2 for q in seqs)
        for q in seqs:
            ring = sched.snapshots[q.id].cache.ring
            n = int(ring[2].max()) + 1
            assert n >= sched.snapshots[q.id].cache.n  # the last window's rows too
            _, _, again = run(r, s, [q.tokens[:n]], replace(GREEDY, max_tokens=1), snapshot=True)
            ref = again.snapshots[1].cache.ring
            assert np.array_equal(np.sort(ring[2]), np.sort(ref[2])) and (ref[2] >= 0).all()
            order, ref_order = np.argsort(ring[2]), np.argsort(ref[2])
            for a, b in zip(ring[:2], ref[:2]):
                assert np.allclose(a[:, order].astype(np.float32), b[:, ref_order].astype(np.float32), atol=2e-2)


def test_a_paused_or_saved_stream_drafts_on_as_if_uninterrupted(tmp_path):
    """The ring travels with the stream: resumed on another lane (from memory and from a file),
    its drafts after the resume are the uninterrupted run's."""
    r, s = runner(), settings()
    p = prompts(1)
    whole, _, ws = run(r, s, p, drafter=Recording)
    full = ws.verifier.drafter.proposed
    half, _, hs = run(r, s, p, replace(GREEDY, max_tokens=17), snapshot=True)
    snap = hs.snapshots[1]
    assert len(snap.cache.ring) == 3 and sorted(snap.cache.ring[2][snap.cache.ring[2] >= 0])[:snap.cache.n] == \
        list(range(snap.cache.n))
    path = tmp_path / "s.kv"
    snapshots.save(path, snap, r.fingerprint, s.page_tokens)
    for resumed in (snap, snapshots.load(path, r.fingerprint, s.kv_dtype)):
        sched = r.scheduler(s)
        rec = Recording(sched)
        sched.verifier = Verifier(sched, rec, s.draft_tokens)
        busy = r.sequence(100, s, None, GREEDY, lambda e: None, prompts(3)[2])  # takes lane 0
        seq = r.sequence(1, s, None, GREEDY, lambda e: None, resume=resumed)
        run_to_end(sched, [busy, seq])
        assert (busy.lane.index, seq.lane.index) == (0, 1) and seq.tokens == whole[0].tokens
        mine = {n: dr for (i, n), dr in rec.proposed.items() if i == 1 and (1, n) in full}
        assert len(mine) > 5 and all(full[(1, n)] == dr for n, dr in mine.items())


def test_a_drafter_failing_mid_stream_leaves_that_stream_plain(capsys):
    r, s = runner(), settings()
    plain, _, _ = run(r, replace(s, drafter="none"), prompts())

    class Breaks(Recording):
        def block(self, anchor, p, lane):
            if lane == 1 and p > 40:
                raise FloatingPointError("the drafter's block broke")
            return super().block(anchor, p, lane)
    seqs, done, _ = run(r, s, prompts(), drafter=Breaks)
    assert [q.tokens for q in seqs] == [q.tokens for q in plain]
    assert [q.draft == OFF for q in seqs] == [False, True, False]
    assert "drafter dflash2 failed on request 2 (FloatingPointError: the drafter's block broke); that stream " \
           "continues without drafts" in capsys.readouterr().err
    assert all(d.reason == "length" for d in done.values())


def test_first_draft_rejected_eos_and_context_limit_inside_windows():
    """Random weights: most first drafts are rejected; an end of stream (EOS, the context) inside
    a window ends it where plain decoding does."""
    r = runner()
    s = settings(context=64, parallel=2)
    plain, pdone, _ = run(r, replace(s, drafter="none"), prompts(2), replace(GREEDY, max_tokens=100))
    seqs, done, sched = run(r, s, prompts(2), replace(GREEDY, max_tokens=100), drafter=Recording)
    assert [q.tokens for q in seqs] == [q.tokens for q in plain] and all(len(q.tokens) == 64 for q in seqs)
    assert [d.reason for d in done.values()] == [d.reason for d in pdone.values()] == ["length", "length"]
    proposed = sched.verifier.drafter.proposed
    rejected = [n for (i, n), dr in proposed.items() if dr and seqs[i - 1].tokens[n] != dr[0]]
    assert len(rejected) > len(proposed) // 2
    stop = plain[0].tokens[plain[0].prompt_len + 9]
    tok, old = r.tokenizer, r.tokenizer.eos_ids
    tok.eos_ids = {stop}
    until_eos = replace(GREEDY, max_tokens=100, ignore_eos=False)
    try:
        alone = run(r, replace(s, drafter="none"), prompts(1), until_eos)[0][0]
        drafted, done, _ = run(r, s, prompts(1), until_eos, drafter=lambda sc: Recording(sc, [plain[0].tokens]))
    finally:
        tok.eos_ids = old
    assert drafted[0].tokens == alone.tokens and alone.tokens[-1] == stop and done[1].reason == "eos"
    assert drafted[0].stats.accepted > 0


# --- the plan -----------------------------------------------------------------------------------
def test_plan_counts_the_ring_and_caps_k_at_the_block():
    r = runner()
    s = settings(draft_tokens=16)
    sched = r.scheduler(s)
    p, cfg = sched.plan, sched.verifier.drafter.cfg
    assert p.drafter == "dflash2" and p.draft_tokens == cfg.block - 1 == 7
    assert p.draft_ring == (2, 48, 2, 16)
    assert p.ring_bytes == ring_bytes(4, p.draft_ring) == 4 * 48 * (2 * 2 * 32 * 2 + 4)
    assert "drafter dflash2 (7 drafts per window, context ring 0.00 GiB)" in p.line
    plain = r.scheduler(replace(s, drafter="none"))
    assert p.total_bytes - plain.plan.total_bytes == p.ring_bytes + p.state_bytes - plain.plan.state_bytes
    assert sched.cache.nbytes - plain.cache.nbytes == (p.ring_bytes + p.state_bytes - plain.plan.state_bytes)
    # the whole context when a layer has no window
    assert replace(cfg, windows=(48, None)).ring(256) == (2, 256, 2, 16)
