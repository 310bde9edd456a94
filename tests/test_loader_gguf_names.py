"""llama.cpp's names and layouts (engine.loader.gguf_names) and GGUF metadata for qwen35/qwen35moe:
every architecture and type loads to exactly the weights of the same values written as a Hugging
Face folder, and a tiny qwen35 GGUF generates the same greedy tokens as that folder."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from engine.config import FULL, LINEAR
from engine.engine import Runner, run_to_end
from engine.errors import ModelError
from engine.loader import describe, load_config, load_model
from engine.loader.gguf_names import canonical, grouped
from engine.ops import cuda_available
from engine.settings import EngineSettings, SamplingParams
from engine.weights import dequantize

import ckpt
import ckpt_gguf
import fuzz_files as ff

ARCHES = ("llama", "qwen3", "qwen3_5", "qwen3_5_moe")
TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M")


def write_pair(folder: Path, arch: str, qtype: str, seed: int = 1) -> tuple[Path, Path]:
    """A GGUF of `qtype` (Q4_K_M: llama.cpp's mix) and an HF float32 folder of the values it stores."""
    cfg = ckpt.tiny_gguf_config(arch)
    path = folder / f"tiny-{arch}.{qtype}.gguf"
    mix = ckpt_gguf.MIX_Q4_K_M if qtype == "Q4_K_M" else None
    ref = ckpt_gguf.write_gguf(path, cfg, seed=seed, qtype="Q4_K" if mix else qtype,
                               embed_qtype="Q8_0" if mix else qtype, mix=mix)
    hf = folder / f"hf-{arch}-{qtype}"
    ckpt.write_hf(hf, cfg, dtype="f32", tensors=ref)
    return path, hf


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[tuple[str, str], tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("gguf-pairs")
    return {(a, q): write_pair(root, a, q) for a in ARCHES for q in TYPES}


def test_tiling_is_llama_cpps() -> None:
    """_LinearAttentionVReorderBase: grouped [K0v0, K0v1, K1v0, K1v1] → tiled [K0v0, K1v0, K0v1, K1v1]."""
    heads = np.array(["K0v0", "K0v1", "K1v0", "K1v1"])
    tiled = ckpt_gguf.tile_v_heads(heads, 0, 2, 4, 1)
    assert tiled.tolist() == ["K0v0", "K1v0", "K0v1", "K1v1"]
    assert tiled[grouped(2, 4, 1)].tolist() == heads.tolist()
    rows = np.arange(2 * 6 * 3).reshape(12, 3)  # 2 key heads, 6 value heads of 2 rows each
    assert np.array_equal(ckpt_gguf.tile_v_heads(rows, 0, 2, 6, 2)[grouped(2, 6, 2)], rows)
    assert np.array_equal(ckpt_gguf.tile_v_heads(ckpt_gguf.tile_v_heads(rows, 1, 1, 3, 1), 1, 1, 3, 1,
                                                 inverse=True), rows)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("qtype", TYPES)
def test_weights_equal_the_same_values_as_hf(pairs, arch: str, qtype: str) -> None:
    path, hf = pairs[arch, qtype]
    g, h = load_model(path), load_model(hf)
    assert set(g.weights) == set(h.weights)
    assert g.config.rms_eps == pytest.approx(h.config.rms_eps, rel=1e-7)  # GGUF stores it as fp32
    assert dataclasses.replace(g.config, rms_eps=h.config.rms_eps) == h.config
    for name, w in h.weights.items():
        np.testing.assert_array_equal(dequantize(g.weights[name]), dequantize(w), err_msg=name)
    assert describe(path).endswith("GGUF " + {"Q4_K": "Q4_K_S", "Q5_K": "Q5_K_S"}.get(qtype, qtype))


def test_qwen35_config_from_metadata(pairs) -> None:
    c = load_config(pairs["qwen3_5_moe", "Q4_K"][0])
    t = ckpt.tiny_gguf_config("qwen3_5_moe")["text_config"]
    assert c.arch == "qwen3_5_moe" and c.layers == 4 and c.layer_types == [LINEAR, LINEAR, LINEAR, FULL]
    assert (c.lin_k_heads, c.lin_v_heads, c.lin_k_dim, c.lin_v_dim, c.conv_kernel) == (4, 8, 32, 32, 4)
    assert (c.experts, c.top_k, c.expert_intermediate, c.shared_intermediate) == (4, 2, 256, 256)
    assert c.rotary_dim == 16 and c.attn_output_gate and c.qk_norm and c.mtp_layers == t["mtp_num_hidden_layers"]


def test_the_mtp_head_is_the_blocks_after_the_model(pairs) -> None:
    cfg = load_config(pairs["qwen3_5", "Q8_0"][0])
    assert canonical("blk.4.nextn.eh_proj.weight", cfg) == "mtp.fc"
    assert canonical("blk.4.nextn.shared_head_norm.weight", cfg) == "mtp.norm"
    assert canonical("blk.4.attn_q.weight", cfg) == "mtp.layers.0.self_attn.q_proj"
    assert canonical("blk.4.nextn.embed_tokens.weight", cfg) == ""  # a copy of the model's own: skipped
    assert canonical("blk.5.attn_q.weight", cfg) is None
    assert canonical("blk.0.ssm_a", cfg) == "layers.0.linear_attn.A_log"
    assert canonical("blk.0.ssm_dt.bias", cfg) == "layers.0.linear_attn.dt_bias"
    assert canonical("blk.0.ffn_gate_up_exps", cfg) == "layers.0.mlp.experts.gate_up_proj"
    assert canonical("blk.0.mystery.weight", cfg) is None
    assert load_model(pairs["qwen3_5", "Q8_0"][0]).config.mtp_layers == 1


# --- greedy output: the GGUF and the folder of the same values -------------------------------------

def greedy(model: Path, prompts: list[list[int]], tokens: int = 10) -> list[list[int]]:
    s = EngineSettings(model=str(model), backend="numpy", parallel=2, context=256, memory_gib=1)
    r = Runner(s, log=lambda m: None)
    sched = r.scheduler(s)
    seqs = [r.sequence(i + 1, s, None, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True),
                       lambda e: None, prompt_ids=p) for i, p in enumerate(prompts)]
    run_to_end(sched, seqs)
    return [q.tokens[q.prompt_len:] for q in seqs]


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe"])
def test_greedy_output_equals_the_hf_folder(pairs, arch: str) -> None:
    path, hf = pairs[arch, "Q4_K_M"]
    prompts = [[5, 17, 99, 3, 250, 41], list(range(30, 100, 3))]
    out = greedy(path, prompts)
    assert out == greedy(hf, prompts)
    assert len({t for o in out for t in o}) > 3  # a real run, not one repeated token


# --- bad files: one line naming the key or tensor -------------------------------------------------

def rewritten(src: Path, dst: Path, kv: dict | None = None, tensors=None) -> Path:
    kvs, ts = ff.read_gguf(src)
    kvs = [k for k in kvs if k.key not in (kv or {})] + [ff.KV(k, t, v) for k, (t, v) in (kv or {}).items()]
    ff.write_gguf(dst, kvs, ts if tensors is None else tensors(ts))
    return dst


@pytest.mark.parametrize("key, value, words", [
    ("qwen35.ssm.inner_size", (ff.U32, 100), "metadata qwen35.ssm.inner_size must be a multiple of"),
    ("qwen35.ssm.time_step_rank", (ff.U32, 0), "metadata qwen35.ssm.time_step_rank must be an integer in 1"),
    ("qwen35.rope.dimension_sections", (ff.ARR, (ff.I32, [4, 4, 4, 0])), "must be up to 4 counts that add up to 8"),
    ("qwen35.rope.dimension_sections", (ff.ARR, (ff.STR, ["a"])), "must be a list of ints"),
    ("qwen35.full_attention_interval", (ff.U32, 9), r"full_attention_interval must be an integer in 1..4"),
    ("qwen35.nextn_predict_layers", (ff.U32, 5), r"nextn_predict_layers must be an integer in 0..4"),
    ("qwen35.feed_forward_length", (ff.STR, "x"), "feed_forward_length must be an integer"),
])
def test_mutated_qwen35_metadata(pairs, tmp_path: Path, key, value, words) -> None:
    path = rewritten(pairs["qwen3_5", "Q8_0"][0], tmp_path / "m.gguf", {key: value})
    with pytest.raises(ModelError, match="m.gguf: .*" + words) as e:
        load_model(path)
    assert "\n" not in str(e.value)


def test_a_positive_ssm_a_is_refused(pairs, tmp_path: Path) -> None:
    def flip(ts):
        return [ff.GTensor(t.name, t.dims, t.ggml_type, np.abs(np.frombuffer(t.data, np.float32)).tobytes())
                if t.name == "blk.1.ssm_a" else t for t in ts]
    path = rewritten(pairs["qwen3_5", "Q8_0"][0], tmp_path / "a.gguf", tensors=flip)
    with pytest.raises(ModelError, match=r"a.gguf: tensor blk.1.ssm_a must hold −exp\(A_log\)"):
        load_model(path)


def test_an_unknown_tensor_is_refused_by_name(pairs, tmp_path: Path) -> None:
    def extra(ts):
        return ts + [ff.GTensor("blk.0.ssm_mystery.weight", [4], 0, bytes(16))]
    path = rewritten(pairs["qwen3_5", "Q8_0"][0], tmp_path / "u.gguf", tensors=extra)
    with pytest.raises(ModelError, match="tensor blk.0.ssm_mystery.weight is not part of a qwen3_5 model"):
        load_model(path)


# --- the GPU: every architecture's Q4_K_M mix (Q4_K, Q6_K, Q8_0, experts) loaded by the CuPy backend --

GPU_OK, GPU_WHY = cuda_available()


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_OK, reason=GPU_WHY or "no GPU")
@pytest.mark.parametrize("precision,tol", [("exact", 1e-3), ("fp16", 1e-2)])
@pytest.mark.parametrize("arch", ARCHES)
def test_a_q4_k_m_gguf_on_the_gpu_gives_the_numpy_logits(pairs, arch: str, precision: str, tol: float) -> None:
    """The prompt's products exact (today's tolerance) or in fp16 (2^-11 an element: ten times it)."""
    path, _ = pairs[arch, "Q4_K_M"]
    prompt = list(range(30, 100, 3))
    logits = []
    for backend in ("numpy", "cupy"):
        s = EngineSettings(model=str(path), backend=backend, parallel=1, context=256, memory_gib=1,
                           prefill_precision=precision)
        r = Runner(s, log=lambda m: None)
        logits.append(r.scheduler(s).prompt_logits(prompt))
    assert np.linalg.norm(logits[1] - logits[0]) <= tol * np.linalg.norm(logits[0])
