"""The MTP head: its logits against a float64 reference of the equations (qwen3_5's MTP: fc over
[embedding ‖ hidden], one gated full-attention layer, the model's head), its K/V on the stream's
pages, and the refusal where a checkpoint has no head."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.drafters.mtp import MtpDrafter
from engine.engine import Runner
from engine.errors import ModelError
from engine.kv.cache import F32
from engine.plan import make_plan
from engine.settings import EngineSettings
from engine.weights import dequantize

import reference

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def silu(x):
    return x / (1.0 + np.exp(-x))


def reference_mtp(model, tokens: list[int], hidden: np.ndarray) -> np.ndarray:
    """float64 logits of every row: row t reads token t (the one after its position) and hidden t."""
    c = model.config
    W = {k[4:]: dequantize(v).astype(np.float64) for k, v in model.weights.items() if k.startswith("mtp.")}
    E = dequantize(model.weights["embed_tokens"]).astype(np.float64)
    head = dequantize(model.weights.get("lm_head", model.weights["embed_tokens"])).astype(np.float64)
    T = len(tokens)

    def norm(x, w):
        return reference.rms_norm(x, w, c.rms_eps)
    x = np.concatenate([norm(E[tokens], W["pre_fc_norm_embedding"]), norm(hidden, W["pre_fc_norm_hidden"])], -1)
    x = x @ W["fc"].T
    p = "layers.0."
    h = norm(x, W[p + "input_layernorm"])
    a = p + "self_attn."
    qg = (h @ W[a + "q_proj"].T).reshape(T, c.heads, 2 * c.head_dim)
    q, gate = qg[..., : c.head_dim], qg[..., c.head_dim:].reshape(T, -1)
    k = (h @ W[a + "k_proj"].T).reshape(T, c.kv_heads, c.head_dim)
    v = (h @ W[a + "v_proj"].T).reshape(T, c.kv_heads, c.head_dim)
    q = reference.rope(norm(q, W[a + "q_norm"]), c.rope_theta, c.rotary_dim)
    k = reference.rope(norm(k, W[a + "k_norm"]), c.rope_theta, c.rotary_dim)
    x = x + (reference.causal_attention(q, k, v) / (1.0 + np.exp(-gate))) @ W[a + "o_proj"].T
    h = norm(x, W[p + "post_attention_layernorm"])
    m = p + "mlp."
    x = x + (silu(h @ W[m + "gate_proj"].T) * (h @ W[m + "up_proj"].T)) @ W[m + "down_proj"].T
    return norm(x, W["norm"]) @ head.T, norm(x, W["norm"])


@pytest.fixture(scope="module")
def qwen():
    s = EngineSettings(model=str(FIXTURES / "tiny_qwen3_5"), backend="numpy", parallel=2, context=256,
                       memory_gib=1, drafter="mtp", draft_tokens=3)
    return Runner(s, log=lambda m: None), s


def test_head_logits_match_the_float64_reference(qwen):
    r, s = qwen
    sched = r.scheduler(s, F32)  # lossless K/V: only float32 rounding remains
    mtp = sched.verifier.drafter
    assert isinstance(mtp, MtpDrafter) and mtp.kv_index == len(r.loaded.config.attention_layers)
    rng = np.random.default_rng(3)
    T, H = 9, r.loaded.config.hidden
    tokens = rng.integers(3, r.loaded.config.vocab, T + 1).tolist()
    hidden = rng.normal(0, 1, (T + 1, H)).astype(np.float32)
    lane = sched.lanes.acquire()
    sched.lanes.ensure(lane, T + 1)
    table = sched.lanes.table(lane)
    logits, out = mtp.head(np.array(tokens[:T], np.int32), hidden[:T], np.arange(T, dtype=np.int32), table,
                           lane.index)
    ref, ref_out = reference_mtp(r.loaded, tokens[:T], hidden[:T].astype(np.float64))
    scale = np.abs(ref[-1]).max()
    assert np.abs(np.asarray(logits)[0] - ref[-1]).max() <= 2e-4 * scale
    # A draft fed back: the head's own output as the hidden of the next position, over T + 1 keys.
    logits2, _ = mtp.head(np.array([tokens[T]], np.int32), out, np.array([T], np.int32), table, lane.index)
    h2 = np.concatenate([hidden[:T].astype(np.float64), np.asarray(out, np.float64)])
    ref2, _ = reference_mtp(r.loaded, tokens[:T + 1], h2)
    assert np.abs(np.asarray(logits2)[0] - ref2[-1]).max() <= 2e-4 * np.abs(ref2[-1]).max()
    assert np.abs(np.asarray(out)[0] - ref_out[-1]).max() <= 2e-4 * np.abs(ref_out[-1]).max()


def test_plan_counts_the_head_layer_and_the_window_state(qwen):
    r, s = qwen
    cfg = r.loaded.config
    plain = make_plan(cfg, replace(s, drafter="none"), free_bytes=1 << 34)
    drafted = make_plan(cfg, s, free_bytes=1 << 34)
    per_layer = cfg.kv_bytes_per_token("bf16") // len(cfg.attention_layers)
    assert drafted.page_bytes == plain.page_bytes + s.page_tokens * per_layer
    n, k, per = s.parallel, s.draft_tokens, cfg.state_bytes_per_stream()
    L, C, Hv = len(cfg.linear_layers), cfg.conv_channels * (cfg.conv_kernel - 1), cfg.lin_v_heads
    # conv rows: slots and a scratch slot per window row; the DeltaNet state: the lanes' slots alone
    # and a log per window row after the first; both a checkpoint slot per stream
    conv_more = L * (n + 1) * k * C * 4
    logs = L * (n + 1) * k * Hv * (cfg.lin_k_dim + cfg.lin_v_dim + 1) * 4
    assert (plain.state_bytes, drafted.state_bytes) == ((2 * n + 1) * per, (2 * n + 1) * per + conv_more + logs)
    assert drafted.state_bytes < ((n + 1) * (k + 1) + n) * per  # less than every row's state kept
    cache = r.scheduler(s).cache
    assert cache.state_bytes == drafted.state_bytes
    assert drafted.draft_layers == 1 and "drafter mtp (3 drafts per window)" in drafted.line
    assert len(cache.k) == len(cfg.attention_layers) + 1


def test_a_model_without_a_head_is_refused_and_runs_plain():
    s = EngineSettings(model="synthetic:tiny-llama", backend="numpy", parallel=2, context=128, drafter="mtp")
    r = Runner(s, log=lambda m: None)
    sched = r.scheduler(s)
    assert sched.verifier is None and sched.plan.drafter == "none"
    assert "drafter mtp refused: the checkpoint ships no MTP head" in sched.plan.line
    with pytest.raises(ModelError, match="no MTP head"):
        MtpDrafter(r.model, r.backend)
