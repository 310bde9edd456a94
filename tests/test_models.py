"""The numpy forward against an independent float64 re-implementation (full sequence, no cache)."""
import numpy as np
import pytest

from engine.engine import Runner
from engine.settings import EngineSettings
from engine.weights import dequantize

import reference
from reference import causal_attention, rms_norm


def reference_logits(model, ids: list[int]) -> np.ndarray:
    """Textbook llama/qwen3 in float64: RMSNorm, GQA with NeoX RoPE, SwiGLU."""
    c, W = model.config, {k: dequantize(v).astype(np.float64) for k, v in model.weights.items()}
    T = len(ids)

    def norm(x, w):
        return rms_norm(x, w, c.rms_eps)

    def rope(x):  # [T, heads, hd]
        return reference.rope(x, c.rope_theta, c.rotary_dim)

    x = W["embed_tokens"][ids]
    for i in range(c.layers):
        p = f"layers.{i}."
        h = norm(x, W[p + "input_layernorm"])

        def lin(x, n, p=p):
            return x @ W[p + n].T + W.get(p + n + ".bias", 0)
        q = lin(h, "self_attn.q_proj").reshape(T, c.heads, c.head_dim)
        k = lin(h, "self_attn.k_proj").reshape(T, c.kv_heads, c.head_dim)
        v = lin(h, "self_attn.v_proj").reshape(T, c.kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = norm(q, W[p + "self_attn.q_norm"]), norm(k, W[p + "self_attn.k_norm"])
        q, k = rope(q), rope(k)
        x = x + lin(causal_attention(q, k, v), "self_attn.o_proj")
        h = norm(x, W[p + "post_attention_layernorm"])
        g, u = h @ W[p + "mlp.gate_proj"].T, h @ W[p + "mlp.up_proj"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "mlp.down_proj"].T
    head = W.get("lm_head", W["embed_tokens"])
    return norm(x, W["norm"])[-1] @ head.T


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
@pytest.mark.parametrize("chunk", [16, 128])
def test_numpy_forward_matches_float64_reference(name, chunk):
    s = EngineSettings(model=f"synthetic:{name}", backend="numpy", parallel=1, context=512, prefill_chunk=chunk,
                       memory_gib=1)
    r = Runner(s, log=lambda m: None)
    ids = list(np.random.default_rng(3).integers(3, r.loaded.config.vocab, 70))
    ours = r.scheduler(s).prompt_logits(ids)
    ref = reference_logits(r.loaded, ids)
    # bf16 K/V in the cache is the only rounding beyond float32.
    assert np.abs(ours - ref).max() <= 2e-2 * np.abs(ref).max()
    assert int(np.argmax(ours)) == int(np.argmax(ref))


def test_attention_biases_are_applied():
    """Qwen2-style q/k/v/o biases (loaded as llama) take part in the forward."""
    s = EngineSettings(model="synthetic:tiny-llama", backend="numpy", parallel=1, context=256, memory_gib=1)
    from engine.models import build
    from engine.ops.numpy_backend import NumpyBackend
    from engine.plan import make_plan
    from engine.scheduler import Scheduler
    from engine.synthetic import synthetic
    m = synthetic("tiny-llama")
    rng = np.random.default_rng(1)
    for i in range(m.config.layers):
        for n, width in (("q_proj", 64), ("k_proj", 32), ("v_proj", 32), ("o_proj", 64)):
            m.weights[f"layers.{i}.self_attn.{n}.bias"] = rng.normal(0, 0.5, width).astype(np.float32)
    sched = Scheduler(s, make_plan(m.config, s), build(m, NumpyBackend()), NumpyBackend(), m.tokenizer)
    assert sched.s.prefill_chunk == NumpyBackend.prompt_chunk  # the settings left it to the backend
    ids = list(range(30, 50))
    ref = reference_logits(m, ids)
    assert np.abs(sched.prompt_logits(ids) - ref).max() <= 2e-2 * np.abs(ref).max()


def test_decode_rows_continue_the_prompt_form():
    """A decode row after a prompt gives the logits the reference gives for the longer prompt."""
    from engine.rows import Rows
    s = EngineSettings(model="synthetic:tiny-qwen3", backend="numpy", parallel=2, context=256, paging="all",
                       page_tokens=16, prefill_chunk=16, memory_gib=1)
    r = Runner(s, log=lambda m: None)
    sched = r.scheduler(s)
    ids = list(range(20, 61))
    lane = sched.lanes.acquire()
    assert sched.lanes.ensure(lane, len(ids))
    table = sched.lanes.table(lane)
    for start in range(0, len(ids) - 1, 16):  # prompt chunks at multiples of 16, all but the last token
        end = min(start + 16, len(ids) - 1)
        n = end - start
        rows = Rows(ids[start:end], np.arange(start, end), np.tile(table, (n, 1)), [0] * n, True, 16)
        r.model.forward(rows, sched.cache)
    last = len(ids) - 1
    logits = r.model.forward(Rows([ids[last]], [last], table[None], [0], False), sched.cache)[0]
    ref = reference_logits(r.loaded, ids)
    assert np.abs(logits - ref).max() <= 2e-2 * np.abs(ref).max()
