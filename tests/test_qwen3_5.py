"""Qwen3.5 / Qwen3.6 (dense and MoE): the numpy twins, the model against transformers' golden outputs
and an independent float64 reference, and the exactness gates with recurrent state.

Tolerances (stated once, used below):
- numpy twins vs float64 textbook forms: 2e-5 relative to the output scale (pure float32 rounding);
- the chunked prompt form of DeltaNet vs the recurrent form: 1e-4 relative (different summation orders
  through the (I+L)⁻¹ transform);
- the float64 reference vs transformers' golden logits: 1e-4 relative to the logit scale;
- the model vs the float64 reference (2e-4) and vs transformers' golden logits (1e-4, prompt and each
  decode step) with K/V kept in float32 (the test-only store `kv.cache.F32`), and the greedy tokens
  exactly (the fixtures are built with every greedy step at least 0.05 logits from a tie;
  make_golden_qwen3_5.py);
- the model with bf16 / fp8 K/V vs the golden logits: 5e-2 / 0.2 relative (the K/V rounding, which
  for a one-token prompt reaches ~3% of the logit scale on these random weights);
- the gates: token ids exactly equal.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.config import FULL
from engine.engine import Runner, run_to_end
from engine.kv import Lane
from engine.kv.cache import F32
from engine.ops.numpy_backend import NumpyBackend
from engine.rows import Rows
from engine.settings import EngineSettings, SamplingParams
from engine.weights import dequantize, quantize

import reference
from reference import causal_attention, rms_norm

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SYNTH = ["tiny-qwen3.5", "tiny-qwen3.5-moe"]
HF = ["tiny_qwen3_5", "tiny_qwen3_5_moe", "tiny_qwen3_5_mlx4", "tiny_qwen3_5_moe_mlx4"]
B = NumpyBackend()


# --- float64 textbook forms ---------------------------------------------------------------------

def silu(x):
    return x / (1.0 + np.exp(-x))


def l2n(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def ref_conv(x, w, state=None):
    """Causal depthwise conv + SiLU over [T, C] with K-1 rows of history (zeros by default)."""
    K = w.shape[1]
    hist = np.zeros((K - 1, x.shape[1])) if state is None else state.T
    full = np.concatenate([hist, x], 0)
    y = sum(w[:, j] * full[j:j + len(x)] for j in range(K))
    return silu(y), full[len(x):].T


def ref_deltanet(q, k, v, g, beta, S=None):
    """The recurrence token by token in float64: q, k [T, Hk, Dk] raw, v [T, Hv, Dv] → o, final S."""
    T, hv, dv = v.shape
    rep = hv // q.shape[1]
    q = np.repeat(l2n(q) * q.shape[-1] ** -0.5, rep, 1)
    k = np.repeat(l2n(k), rep, 1)
    S = np.zeros((hv, k.shape[-1], dv)) if S is None else S.astype(np.float64)
    out = np.zeros((T, hv, dv))
    for t in range(T):
        S = S * np.exp(g[t])[:, None, None]
        delta = beta[t][:, None] * (v[t] - np.einsum("hkv,hk->hv", S, k[t]))
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", S, q[t])
    return out, S


def reference_logits(model, ids: list[int]) -> np.ndarray:
    """Qwen3.5 / 3.6 in float64 from the canonical weights, whole sequence, DeltaNet in recurrent form."""
    c = model.config
    W = {k: dequantize(v).astype(np.float64) for k, v in model.weights.items()}
    T = len(ids)

    def norm(x, w):
        return rms_norm(x, w, c.rms_eps)

    def rope(x):  # [T, heads, hd], NeoX on the first rotary_dim dims
        return reference.rope(x, c.rope_theta, c.rotary_dim)

    def mlp(p, h):
        if c.experts:
            logits = h @ W[p + "gate"].T
            pr = np.exp(logits - logits.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            out = np.zeros_like(h)
            for t in range(T):
                top = np.argsort(-pr[t], kind="stable")[: c.top_k]
                wts = pr[t, top] / pr[t, top].sum()
                for e, wt in zip(top, wts):
                    a = silu(W[p + "experts.gate_proj"][e] @ h[t]) * (W[p + "experts.up_proj"][e] @ h[t])
                    out[t] += wt * (W[p + "experts.down_proj"][e] @ a)
            s = p + "shared_expert."
            shared = (silu(h @ W[s + "gate_proj"].T) * (h @ W[s + "up_proj"].T)) @ W[s + "down_proj"].T
            return out + shared / (1.0 + np.exp(-(h @ W[p + "shared_expert_gate"].T)))
        return (silu(h @ W[p + "gate_proj"].T) * (h @ W[p + "up_proj"].T)) @ W[p + "down_proj"].T

    x = W["embed_tokens"][ids]
    for i, kind in enumerate(c.layer_types):
        p = f"layers.{i}."
        h = norm(x, W[p + "input_layernorm"])
        if kind == FULL:
            a = p + "self_attn."
            qg = (h @ W[a + "q_proj"].T).reshape(T, c.heads, 2 * c.head_dim)
            q, gate = qg[..., : c.head_dim], qg[..., c.head_dim:].reshape(T, -1)
            k = (h @ W[a + "k_proj"].T).reshape(T, c.kv_heads, c.head_dim)
            v = (h @ W[a + "v_proj"].T).reshape(T, c.kv_heads, c.head_dim)
            q, k = rope(norm(q, W[a + "q_norm"])), rope(norm(k, W[a + "k_norm"]))
            o = causal_attention(q, k, v) / (1.0 + np.exp(-gate))
            x = x + o @ W[a + "o_proj"].T
        else:
            a = p + "linear_attn."
            kd, vd = c.lin_k_heads * c.lin_k_dim, c.lin_v_heads * c.lin_v_dim
            y, _ = ref_conv(h @ W[a + "in_proj_qkv"].T, W[a + "conv1d"])
            q = y[:, :kd].reshape(T, c.lin_k_heads, c.lin_k_dim)
            k = y[:, kd:2 * kd].reshape(T, c.lin_k_heads, c.lin_k_dim)
            v = y[:, 2 * kd:].reshape(T, c.lin_v_heads, c.lin_v_dim)
            beta = 1.0 / (1.0 + np.exp(-(h @ W[a + "in_proj_b"].T)))
            g = -np.exp(W[a + "A_log"]) * np.logaddexp(0.0, h @ W[a + "in_proj_a"].T + W[a + "dt_bias"])
            o, _ = ref_deltanet(q, k, v, g, beta)
            z = (h @ W[a + "in_proj_z"].T).reshape(T, c.lin_v_heads, c.lin_v_dim)
            o = o / np.sqrt((o * o).mean(-1, keepdims=True) + c.rms_eps) * W[a + "norm"] * silu(z)
            x = x + o.reshape(T, vd) @ W[a + "out_proj"].T
        x = x + mlp(p + "mlp.", norm(x, W[p + "post_attention_layernorm"]))
    return norm(x, W["norm"])[-1] @ W["lm_head"].T


def close(a, b, rel):
    err = np.abs(np.asarray(a, np.float64) - b).max()
    assert err <= rel * max(1.0, np.abs(b).max()), f"max error {err:.3g} over {rel} × scale {np.abs(b).max():.3g}"


# --- the numpy twins ----------------------------------------------------------------------------

def deltanet_inputs(rng, T, hk=2, hv=4, dk=16, dv=8):
    q = rng.normal(size=(T, hk, dk)).astype(np.float32)
    k = rng.normal(size=(T, hk, dk)).astype(np.float32)
    v = rng.normal(size=(T, hv, dv)).astype(np.float32)
    a, b = rng.normal(size=(T, hv)).astype(np.float32), rng.normal(size=(T, hv)).astype(np.float32)
    g, beta = B.deltanet_gates(a, b, np.log(rng.uniform(1, 16, hv)).astype(np.float32),
                               rng.normal(0, 0.5, hv).astype(np.float32))
    return q, k, v, g, beta


def test_deltanet_gates():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 10, (5, 4)).astype(np.float32), rng.normal(0, 3, (5, 4)).astype(np.float32)
    a_log, dt = rng.normal(size=4).astype(np.float32), rng.normal(size=4).astype(np.float32)
    g, beta = B.deltanet_gates(a, b, a_log, dt)
    close(g, -np.exp(a_log.astype(np.float64)) * np.logaddexp(0, a.astype(np.float64) + dt), 2e-5)
    close(beta, 1 / (1 + np.exp(-b.astype(np.float64))), 2e-5)
    assert (g <= 0).all() and g.dtype == beta.dtype == np.float32


@pytest.mark.parametrize("T", [1, 5, 64, 150])
def test_deltanet_step_and_prompt_match_the_recurrence(T):
    rng = np.random.default_rng(T)
    q, k, v, g, beta = deltanet_inputs(rng, T)
    S0 = rng.normal(0, 0.3, (4, 16, 8)).astype(np.float32)
    ref, S_ref = ref_deltanet(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), g, beta, S0)
    # decode form: one row at a time, the state in slot 2 of 4; the other slots untouched
    state = rng.normal(size=(4, 4, 16, 8)).astype(np.float32)
    other = state.copy()
    state[2] = S0
    out = np.concatenate([B.deltanet_step(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], state, [2])
                          for t in range(T)])
    close(out, ref, 2e-5)
    close(state[2], S_ref, 2e-5)
    assert np.array_equal(np.delete(state, 2, 0), np.delete(other, 2, 0))
    # prompt form: all rows at once, chunks of 64
    state2 = other.copy()
    state2[1] = S0
    out2 = B.deltanet_prompt(q, k, v, g, beta, state2, 1, 64)
    close(out2, ref, 1e-4)
    close(state2[1], S_ref, 1e-4)
    assert np.array_equal(np.delete(state2, 1, 0), np.delete(other, 1, 0))


def test_deltanet_decode_rows_are_independent_of_the_batch():
    rng = np.random.default_rng(1)
    q, k, v, g, beta = deltanet_inputs(rng, 3)
    state = rng.normal(size=(5, 4, 16, 8)).astype(np.float32)
    alone = []
    for i, lane in enumerate([3, 0, 4]):
        s = state.copy()
        alone.append((B.deltanet_step(q[i:i + 1], k[i:i + 1], v[i:i + 1], g[i:i + 1], beta[i:i + 1], s, [lane])[0],
                      s[lane].copy()))
    together = state.copy()
    out = B.deltanet_step(q, k, v, g, beta, together, np.array([3, 0, 4]))
    for i, lane in enumerate([3, 0, 4]):
        assert np.array_equal(out[i], alone[i][0]) and np.array_equal(together[lane], alone[i][1])


def test_conv1d_prompt_and_step():
    rng = np.random.default_rng(2)
    T, C, K = 9, 6, 4
    x = rng.normal(size=(T, C)).astype(np.float32)
    w = rng.normal(size=(C, K)).astype(np.float32)
    st0 = rng.normal(size=(C, K - 1)).astype(np.float32)
    ref, ref_state = ref_conv(x.astype(np.float64), w.astype(np.float64), st0.astype(np.float64))
    for cut in ([T], [2, 7], [1, 1, 1, 6]):  # the prompt form in pieces, like prompt chunks
        state = np.zeros((3, C, K - 1), np.float32)
        state[1] = st0
        outs, at = [], 0
        for n in cut:
            outs.append(B.conv1d_prompt(x[at:at + n], w, state, 1))
            at += n
        close(np.concatenate(outs), ref, 2e-5)
        close(state[1], ref_state, 0)
        assert not state[0].any() and not state[2].any()
    state = np.zeros((3, C, K - 1), np.float32)
    state[2] = st0
    steps = np.concatenate([B.conv1d_step(x[t:t + 1], w, state, [2]) for t in range(T)])
    prompt_state = np.zeros((3, C, K - 1), np.float32)
    prompt_state[2] = st0
    # the two forms accumulate in the same order: bit-identical
    assert np.array_equal(steps, B.conv1d_prompt(x, w, prompt_state, 2))
    assert np.array_equal(state, prompt_state)


def test_gated_rmsnorm():
    rng = np.random.default_rng(3)
    x, z = rng.normal(size=(3, 4, 8)).astype(np.float32), rng.normal(size=(3, 4, 8)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 8).astype(np.float32)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w * silu(z.astype(np.float64))
    close(B.gated_rmsnorm(x, z, w, 1e-6), ref, 2e-5)


@pytest.mark.parametrize("window,lanes", [(1, [3, 0, -1]), (3, [2, 0])])
def test_deltanet_step_norm_is_step_then_norm(window, lanes):
    """Decode rows and verify windows: the op the model's decode rows call gives deltanet_step's
    state and logs and gated_rmsnorm's output of its rows, exactly."""
    rng = np.random.default_rng(window)
    row_lanes = np.repeat(np.array(lanes, np.int32), window)
    n, stride = len(row_lanes), 5
    q, k, v, g, beta = deltanet_inputs(rng, n)
    z, w = rng.normal(size=(n, 4, 8)).astype(np.float32), rng.uniform(0.5, 1.5, 8).astype(np.float32)
    state = rng.normal(0, 0.3, (5, 4, 16, 8)).astype(np.float32)
    runs = []
    for fused in (False, True):
        st = state.copy()
        logs = tuple(np.zeros((2 * stride, *shape), np.float32) for shape in ((4, 16), (4, 8), (4,)))
        if fused:
            y = B.deltanet_step_norm(q, k, v, g, beta, st, row_lanes, z, w, 1e-6, window, stride, logs)
        else:
            y = B.gated_rmsnorm(B.deltanet_step(q, k, v, g, beta, st, row_lanes, window, stride, logs), z, w, 1e-6)
        runs.append((y, st, *logs))
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_moe_route_and_experts():
    rng = np.random.default_rng(4)
    n, E, k, H, I = 7, 8, 3, 16, 12
    logits = rng.normal(size=(n, E)).astype(np.float32)
    logits[0, 5] = logits[0, 2]  # a tie: the lower id first
    idx, wts = B.moe_route(logits, k)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    for i in range(n):
        top = np.argsort(-p[i], kind="stable")[:k]
        assert idx[i].tolist() == top.tolist()
        close(wts[i], p[i, top] / p[i, top].sum(), 2e-6)
    assert list(idx[0]).index(2) < list(idx[0]).index(5) if 5 in idx[0] else True
    x = rng.normal(size=(n, H)).astype(np.float32)
    gu = rng.normal(size=(E, 2 * I, H)).astype(np.float32) / 4
    down = rng.normal(size=(E, H, I)).astype(np.float32) / 4
    ref = np.zeros((n, H))
    for i in range(n):
        for e, wt in zip(idx[i], wts[i]):
            h = gu[e].astype(np.float64) @ x[i]
            ref[i] += wt * (down[e] @ (silu(h[:I]) * h[I:]))
    decode = B.moe_experts(x, gu, down, idx, wts, prompt=False)
    prompt = B.moe_experts(x, gu, down, idx, wts, prompt=True)
    close(decode, ref, 2e-5)
    close(prompt, ref, 2e-5)
    shared, gate = rng.normal(size=(n, H)).astype(np.float32), rng.normal(size=(n, 1)).astype(np.float32)
    for flag in (False, True):  # the shared expert's gated output on top, the routed sum's bits unchanged
        got = B.moe_experts(x, gu, down, idx, wts, flag, shared, gate)
        close(got, ref + shared / (1 + np.exp(-gate.astype(np.float64))), 2e-5)
        routed = decode if not flag else prompt
        assert np.array_equal(got, routed + shared / (np.float32(1) + np.exp(-gate)))
    for i in range(n):  # decode rows do not depend on each other
        assert np.array_equal(B.moe_experts(x[i:i + 1], gu, down, idx[i:i + 1], wts[i:i + 1])[0], decode[i])
    # the shared expert stacked as expert E: moe_route appends it under sigmoid(gate), and the routed
    # products give the routed sum plus its gated MLP
    sgu = rng.normal(size=(2 * I, H)).astype(np.float32) / 4
    sdown = rng.normal(size=(H, I)).astype(np.float32) / 4
    sidx, swts = B.moe_route(logits, k, gate)
    assert np.array_equal(sidx[:, :k], idx) and np.array_equal(swts[:, :k], wts) and (sidx[:, k] == E).all()
    close(swts[:, k:], 1 / (1 + np.exp(-gate.astype(np.float64))), 2e-7)
    hs = x.astype(np.float64) @ sgu.T.astype(np.float64)
    sref = ref + swts[:, k:] * ((silu(hs[:, :I]) * hs[:, I:]) @ sdown.T.astype(np.float64))
    for flag in (False, True):
        close(B.moe_experts(x, np.concatenate([gu, sgu[None]]), np.concatenate([down, sdown[None]]), sidx, swts,
                            flag), sref, 2e-5)


def test_stack_expert_takes_one_more_expert_of_the_same_format():
    from engine.models.qwen3_5 import stack_expert
    rng = np.random.default_rng(5)
    experts = quantize(rng.normal(size=(3, 8, 64)).astype(np.float32), 4, 32)
    one = quantize(rng.normal(size=(8, 64)).astype(np.float32), 4, 32)
    both = stack_expert(experts, one)
    assert both.shape == (4, 8, 64) and np.array_equal(dequantize(both)[3], dequantize(one))
    assert np.array_equal(dequantize(both)[:3], dequantize(experts))
    assert stack_expert(experts, quantize(rng.normal(size=(8, 64)).astype(np.float32), 8, 32)) is None  # bits
    assert stack_expert(experts, quantize(rng.normal(size=(8, 64)).astype(np.float32), 4, 64)) is None  # group
    assert stack_expert(experts, quantize(rng.normal(size=(4, 64)).astype(np.float32), 4, 32)) is None  # shape
    assert stack_expert(experts, None) is None


@pytest.mark.parametrize("E,H", [(256, 2048), (256, 3072), (512, 4096), (128, 2048), (60, 2048), (8, 64)])
def test_router_gate_keeps_router_segments(E, H):
    """The router fused with the shared expert's gate row: qmv cuts K into the same segments as for
    the router alone, so the router's logits keep their bits (tests/test_kernels_qwen3_5.py checks them)."""
    from kernels.launch import qmv_split
    assert qmv_split(E + 1, H) == qmv_split(E, H)


def test_route_slots_fit_a_launch_without_an_opt_in():
    """moe_route_slots' probabilities (n·E floats of dynamic shared memory) with its three static slot
    arrays of 1,024 ints stay within the 48 KB a launch has without an opt-in."""
    from kernels.launch_qwen3_5 import route_slots_fit
    for E in (8, 64, 256, 512, 1024):
        for n in range(1, 40):
            assert not route_slots_fit(n, E) or n * E * 4 + 3 * 1024 * 4 <= 48 * 1024
    assert route_slots_fit(32, 256) and route_slots_fit(8, 1024) and not route_slots_fit(24, 512)


def test_moe_loads_router_and_gate_as_one_and_the_shared_expert_as_expert_e():
    layer = runner("synthetic:tiny-qwen3.5-moe").model.layers[0]
    E = runner("synthetic:tiny-qwen3.5-moe").loaded.config.experts
    assert "router_gate" in layer and "router" not in layer and "shared_gate" not in layer
    assert layer["router_gate"].shape[0] == E + 1
    assert layer["shared_routed"] and "shared" not in layer
    assert layer["experts_gate_up"].shape[0] == layer["experts_down"].shape[0] == E + 1


def test_a_shared_gate_apart_from_the_router_still_weighs_the_stacked_shared_expert():
    """Router and shared-expert gate as two products (formats that do not fuse) with the shared expert
    stacked as expert E: the gate's logit still adds choice E, as the fused router_gate's does."""
    r = runner("synthetic:tiny-qwen3.5-moe")
    layer, E = r.model.layers[0], r.loaded.config.experts
    apart = {k: v for k, v in layer.items() if k != "router_gate"}
    apart["router"], apart["shared_gate"] = layer["router_gate"][:E], layer["router_gate"][E:]
    h = np.random.default_rng(3).normal(size=(3, layer["router_gate"].shape[1])).astype(np.float32)
    rows = Rows(np.zeros(3, np.int32), np.arange(3), np.zeros((3, 1), np.int32), np.arange(3), False)
    fused = r.model.mlp(layer, h, rows)  # the gate's own product may round its logit 1 ulp apart
    assert np.allclose(r.model.mlp(apart, h, rows), fused, rtol=0, atol=1e-5 * np.abs(fused).max())


# --- the model -----------------------------------------------------------------------------------

def settings(model: str, **kw) -> EngineSettings:
    base = dict(model=model, backend="numpy", parallel=2, context=512, memory_gib=1, kv_dtype="bf16")
    base.update(kw)
    return EngineSettings(**base)


_RUNNERS: dict[str, Runner] = {}


def runner(model: str) -> Runner:
    """One loaded model per name for the whole module (schedulers are cheap, loading is not)."""
    if model not in _RUNNERS:
        _RUNNERS[model] = Runner(settings(model), log=lambda m: None)
    return _RUNNERS[model]


def generate(r: Runner, s: EngineSettings, prompts: list[list[int]], max_tokens: int = 8,
             snapshot: bool = False, kv_store: str | None = None):
    sched = r.scheduler(s, kv_store)
    seqs = [r.sequence(i + 1, s, None, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                       lambda e: None, prompt_ids=p, snapshot_at_end=snapshot) for i, p in enumerate(prompts)]
    run_to_end(sched, seqs)
    return [q.tokens[q.prompt_len:] for q in seqs], sched


def golden(name: str):
    g = np.load(FIXTURES / name / "golden.npz")
    prompts = [g["input_ids"][i, :L].tolist() for i, L in enumerate(g["lengths"])]
    return g, prompts


@pytest.mark.parametrize("name", HF)
def test_fixture_loads(name):
    r = runner(str(FIXTURES / name))
    c = r.loaded.config
    assert c.arch == ("qwen3_5_moe" if "moe" in name else "qwen3_5")
    assert FULL in c.layer_types and len(c.attention_layers) >= 2 and len(c.linear_layers) >= 2
    assert c.heads > c.kv_heads and c.rotary_dim < c.head_dim and c.lin_v_heads > c.lin_k_heads
    assert (c.experts > c.top_k > 1) == ("moe" in name)
    g, _ = golden(name)
    assert g["margins"].min() >= 0.05  # no near ties: greedy tokens are a fair test
    if name.endswith("mlx4"):  # mlx-lm drops the MTP head
        assert r.model.mtp is None and r.loaded.format == "mlx"
    else:  # MTP weights are loaded and kept for the drafter
        assert r.model.mtp is not None and len(r.model.mtp["layers"]) == c.mtp_layers == 1
        assert set(r.model.mtp) >= {"fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"}


@pytest.mark.parametrize("name", HF)
@pytest.mark.parametrize("chunk", [128, 16])
def test_matches_transformers_golden(name, chunk):
    """Last-position logits of each golden prompt, and the 8 greedy tokens HF generated with its cache,
    tightly: K/V kept in float32, as transformers keeps them."""
    g, prompts = golden(name)
    r = runner(str(FIXTURES / name))
    s = settings(str(FIXTURES / name), prefill_chunk=chunk)
    for i, p in enumerate(prompts):
        close(r.scheduler(s, F32).prompt_logits(p), g["logits"][i], 1e-4)
    tokens, _ = generate(r, s, prompts, kv_store=F32)
    assert tokens == g["greedy"].tolist()


@pytest.mark.parametrize("name", HF)
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_matches_transformers_golden_with_stored_kv(name, kv):
    """The same with the K/V dtypes the engine offers: their rounding is the whole difference.
    (A one-token prompt reads its own bf16-rounded V back: up to ~3% of the logit scale here.)"""
    g, prompts = golden(name)
    r = runner(str(FIXTURES / name))
    s = settings(str(FIXTURES / name), kv_dtype=kv)
    for i, p in enumerate(prompts):
        ours = r.scheduler(s).prompt_logits(p)
        close(ours, g["logits"][i], 5e-2 if kv == "bf16" else 0.2)
        assert np.argsort(-ours)[:1] in np.argsort(-g["logits"][i])[:3]


@pytest.mark.parametrize("name", HF)
def test_decode_rows_match_transformers_step_logits(name):
    """Each decode step's logits (the recurrent form after the chunked prompt) against HF's."""
    g, prompts = golden(name)
    if "step_logits" not in g:
        pytest.skip("golden.npz without step_logits (written by an older script)")
    r = runner(str(FIXTURES / name))
    s = settings(str(FIXTURES / name), parallel=1)
    sched = r.scheduler(s, F32)
    p, want = prompts[0], g["greedy"][0].tolist()
    lane = sched.lanes.acquire()
    sched.cache.reset(lane.index)
    assert sched.lanes.ensure(lane, len(p) + 8)
    table = sched.lanes.table(lane)
    C = sched.s.prefill_chunk
    for start in range(0, len(p), C):
        end = min(len(p), start + C)
        logits = r.model.forward(Rows(p[start:end], np.arange(start, end), np.tile(table, (end - start, 1)),
                                      [lane.index] * (end - start), True, C, np.array([end - start - 1])), sched.cache)
    for step in range(8):
        close(logits[0], g["step_logits"][0][step], 1e-4)
        pos = len(p) + step
        logits = r.model.forward(Rows([want[step]], [pos], table[None], [lane.index], False), sched.cache)


@pytest.mark.parametrize("name", SYNTH + HF)
@pytest.mark.parametrize("chunk", [128, 32])
def test_matches_float64_reference(name, chunk):
    """The synthetic shapes (affine 4-bit, routers 8-bit) and the fixtures against the float64 reference."""
    model = str(FIXTURES / name) if name in HF else f"synthetic:{name}"
    r = runner(model)
    s = settings(model, prefill_chunk=chunk)
    ids = [int(t) for t in np.random.default_rng(5).integers(3, r.loaded.config.vocab, 140)]
    ours = r.scheduler(s, F32).prompt_logits(ids)
    ref = reference_logits(r.loaded, ids)
    close(ours, ref, 2e-4)
    assert int(np.argmax(ours)) == int(np.argmax(ref))


@pytest.mark.parametrize("name", HF)
def test_float64_reference_matches_transformers(name):
    """The reference itself (and so what this file takes Qwen3.5 to be) against HF, tightly."""
    g, prompts = golden(name)
    r = runner(str(FIXTURES / name))
    for i, p in enumerate(prompts):
        close(reference_logits(r.loaded, p), g["logits"][i], 1e-4)


def test_zero_centred_norm_mistake_would_show():
    """Guard on the fixtures: with the norms left unshifted the logits are far off."""
    g, prompts = golden("tiny_qwen3_5")
    loaded = runner(str(FIXTURES / "tiny_qwen3_5")).loaded
    from engine.weights import Model
    W = dict(loaded.weights)
    for n in W:
        if n.rsplit(".", 1)[-1] in ("input_layernorm", "post_attention_layernorm", "norm", "q_norm", "k_norm") \
                and not n.endswith("linear_attn.norm"):
            W[n] = W[n] - 1.0
    wrong = reference_logits(Model(loaded.config, W, None, "x", "x", "hf"), prompts[0])
    assert np.abs(wrong - g["logits"][0]).max() > 0.5


# --- state and the gates -------------------------------------------------------------------------

PROMPTS = [list(range(20, 20 + n)) for n in (150, 37, 3)] + [[7] * 64]


@pytest.mark.parametrize("name", SYNTH)
def test_state_allocation_matches_the_plan(name):
    r = runner(f"synthetic:{name}")
    s = settings(f"synthetic:{name}", parallel=3)
    sched = r.scheduler(s)
    c = r.loaded.config
    # a slot and its checkpoint per stream, and the scratch slot
    assert sched.cache.state_bytes == sched.plan.state_bytes == (2 * 3 + 1) * c.state_bytes_per_stream() > 0
    assert len(sched.cache.state) == len(c.linear_layers)


@pytest.mark.parametrize("name", SYNTH)
def test_concurrent_equals_solo(name):
    model = f"synthetic:{name}"
    r = runner(model)
    solo = [generate(r, settings(model, parallel=1), [p])[0][0] for p in PROMPTS]
    for parallel in (2, 4):
        together, _ = generate(r, settings(model, parallel=parallel), PROMPTS)
        assert together == solo, parallel


@pytest.mark.parametrize("name", SYNTH)
def test_paged_equals_contiguous(name):
    model = f"synthetic:{name}"
    r = runner(model)
    base, _ = generate(r, settings(model, paging="off", parallel=4), PROMPTS)
    for paging, page in (("pages", 16), ("all", 64), ("all", 256)):
        got, _ = generate(r, settings(model, paging=paging, page_tokens=page, parallel=4), PROMPTS)
        assert got == base, (paging, page)


@pytest.mark.parametrize("name", SYNTH)
def test_fp8_kv_gates(name):
    model = f"synthetic:{name}"
    r = runner(model)
    solo = [generate(r, settings(model, parallel=1, kv_dtype="fp8"), [p])[0][0] for p in PROMPTS[:3]]
    together, _ = generate(r, settings(model, parallel=3, kv_dtype="fp8", paging="all", page_tokens=16), PROMPTS[:3])
    assert together == solo


@pytest.mark.parametrize("name", SYNTH)
def test_resumed_equals_uninterrupted(name):
    model = f"synthetic:{name}"
    r = runner(model)
    s = settings(model, parallel=2, paging="all", page_tokens=16)
    whole, _ = generate(r, s, PROMPTS[:2], max_tokens=12)
    first, sched = generate(r, s, PROMPTS[:2], max_tokens=5, snapshot=True)
    snaps = [sched.snapshots[i + 1] for i in range(2)]
    assert all(len(sn.cache.state) == len(r.loaded.config.linear_layers) for sn in snaps)
    sched2 = r.scheduler(s)
    seqs = []
    for i, sn in enumerate(snaps):
        seq = r.sequence(10 + i, s, None, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                         lambda e: None, resume=sn)
        seqs.append(seq)
    # another stream runs on the other lane meanwhile: the restored state must not see its rows
    run_to_end(sched2, seqs[:1] + [r.sequence(20, s, None, SamplingParams(temperature=0, max_tokens=3,
                                                                           ignore_eos=True),
                                              lambda e: None, prompt_ids=PROMPTS[3])])
    run_to_end(sched2, seqs[1:])
    assert [q.tokens[q.prompt_len:] for q in seqs] == whole


def test_lane_reuse_starts_from_a_clean_state():
    """A lane that served one stream serves the next from zero state."""
    model = "synthetic:tiny-qwen3.5"
    r = runner(model)
    s = settings(model, parallel=1)
    fresh, _ = generate(r, s, [PROMPTS[1]])
    sched = r.scheduler(s)
    for i, p in enumerate([PROMPTS[0], PROMPTS[1]]):
        seq = r.sequence(i + 1, s, None, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                         lambda e: None, prompt_ids=p)
        run_to_end(sched, [seq])
    assert seq.tokens[seq.prompt_len:] == fresh[0]


def test_read_write_state_roundtrip():
    r = runner("synthetic:tiny-qwen3.5")
    cache = r.scheduler(settings("synthetic:tiny-qwen3.5", parallel=3)).cache
    lane = Lane(1, window=False)  # no K/V positions: the recurrent slots alone
    rng = np.random.default_rng(6)
    state = [(rng.normal(size=cv.shape[1:]).astype(np.float32), rng.normal(size=st.shape[1:]).astype(np.float32))
             for cv, st in cache.state]
    snap = cache.read(lane, 0)
    snap.state = state
    cache.write(lane, snap)
    back = cache.read(lane, 0).state
    assert all(np.array_equal(a, c) and np.array_equal(b, d) for (a, b), (c, d) in zip(state, back))
    assert not any(cv[0].any() or cv[2].any() for cv, _ in cache.state)
    cache.reset(1)
    assert not any(cv[1].any() for cv, _ in cache.state) and not any(st[1].any() for _, st in cache.state)


@pytest.mark.parametrize("name", SYNTH)
def test_gate_suite(name):
    """`python -m engine gates` on the hybrid models (quick arms), both KV dtypes."""
    from engine import gates
    s = EngineSettings(model=f"synthetic:{name}", backend="numpy", parallel=8, context=1024)
    table = gates.run(s, gates.load_chats(None), 8, True, log=lambda m: None)
    assert set(table) == {f"{name} bf16", f"{name} fp8"}
    assert gates.passed(table), gates.render(table)


def test_gates_catch_a_stream_reading_another_lanes_state(monkeypatch):
    """Decode rows that all step the first row's DeltaNet state break concurrent == solo."""
    real = NumpyBackend.deltanet_step

    def leaky(self, q, k, v, g, beta, state, lanes, *window):
        return real(self, q, k, v, g, beta, state, np.repeat(np.asarray(lanes)[:1], len(lanes)), *window)

    model = "synthetic:tiny-qwen3.5"
    r = runner(model)
    solo = [generate(r, settings(model, parallel=1), [p])[0][0] for p in PROMPTS[:3]]
    monkeypatch.setattr(NumpyBackend, "deltanet_step", leaky)
    together, _ = generate(r, settings(model, parallel=3), PROMPTS[:3])
    assert together != solo
