"""GGUF import: metadata, Q4_1/Q8_0 → Affine (checked against gguf's own dequantizer), q/k row order,
tokenizer, and clear errors for files we cannot run."""
from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import ModelError
from engine.fetch import default_model_path
from engine.loader import describe, load_config, load_model
from engine.tokenizer import Tokenizer
from engine.weights import Affine, dequantize

import ckpt
import ckpt_gguf
import fuzz_files as ff

CONFIGS = {"llama": ckpt.tiny_llama_config(), "qwen3": ckpt.tiny_qwen3_config()}


def canonical(hf_name: str) -> str:
    return hf_name.removeprefix("model.").removesuffix(".weight")


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[tuple[str, str], tuple[Path, dict]]:
    out = {}
    for arch, cfg in CONFIGS.items():
        for qtype in ("Q4_1", "Q8_0", "F16"):
            path = tmp_path_factory.mktemp("gguf") / f"tiny-{arch}.{qtype}.gguf"
            out[arch, qtype] = path, ckpt_gguf.write_gguf(path, cfg, seed=3, qtype=qtype)
    return out


@pytest.mark.parametrize("arch", CONFIGS)
@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0", "F16"])
def test_weights_equal_what_was_written(written, arch: str, qtype: str) -> None:
    path, reference = written[arch, qtype]
    m = load_model(path)
    assert m.format == "gguf" and m.meta["label"] == f"GGUF {qtype}"
    assert set(m.weights) == {canonical(n) for n in reference}
    for name, ref in reference.items():
        w = m.weights[canonical(name)]
        if qtype != "F16" and ref.ndim == 2:
            assert isinstance(w, Affine) and w.group == 32
            assert w.bits == (8 if name.endswith("embed_tokens.weight") or qtype == "Q8_0" else 4)
        np.testing.assert_array_equal(dequantize(w), ref, err_msg=name)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_dequantize_equals_gguf_package(written, qtype: str) -> None:
    """Our Affine repacking against gguf.quants.dequantize of the raw blocks, with llama.cpp's q/k row
    permutation undone (HF rows (h, i, j) sit at (h, j, i) of the stored (n_head, hd/2, 2) view)."""
    path, _ = written["llama", qtype]
    cfg = CONFIGS["llama"]
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors}
    m = load_model(path)
    for gname, name, heads in [("blk.0.attn_q.weight", "layers.0.self_attn.q_proj", cfg["num_attention_heads"]),
                               ("blk.1.attn_k.weight", "layers.1.self_attn.k_proj", cfg["num_key_value_heads"]),
                               ("blk.0.ffn_down.weight", "layers.0.mlp.down_proj", None)]:
        t = stored[gname]
        raw = gguf.quants.dequantize(t.data, t.tensor_type)
        if heads:
            raw = raw.reshape(heads, -1, 2, raw.shape[-1]).swapaxes(1, 2).reshape(raw.shape)
        np.testing.assert_array_equal(dequantize(m.weights[name]), raw, err_msg=gname)


def test_config_from_metadata(written) -> None:
    for arch, cfg in CONFIGS.items():
        path, _ = written[arch, "Q4_1"]
        c = load_config(path)
        assert (c.arch, c.hidden, c.layers, c.heads, c.kv_heads, c.head_dim, c.vocab, c.intermediate) == (
            arch, cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"], cfg["intermediate_size"])
        assert c.rope_theta == cfg["rope_theta"] and c.rms_eps == pytest.approx(cfg["rms_norm_eps"])
        assert c.tie_embeddings is (arch == "llama") and c.qk_norm is (arch == "qwen3")
        assert describe(path) == f"tiny-{arch} · {arch} · {cfg['num_hidden_layers']} layers · GGUF Q4_1"


def test_tokenizer_equals_tokenizer_json(written, tmp_path: Path) -> None:
    """The BPE rebuilt from GGUF metadata encodes like the tokenizer.json it came from."""
    path, _ = written["llama", "Q4_1"]
    tok = load_model(path).tokenizer
    ckpt.write_tokenizer(tmp_path)
    ref = Tokenizer.from_folder(tmp_path)
    texts = ["Hello world! 2024", "  spaced  out\n\n", "café 😀 日本", "<|im_start|>user\nhi<|im_end|>", "x=1+2"]
    for text in texts:
        assert tok.encode(text) == ref.encode(text), text
    assert tok.eos_ids == {0, 2} and tok.bos_id == 1
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == ref.render_chat([{"role": "user", "content": "hi"}])


def test_progress_reaches_one(written) -> None:
    seen = []
    load_model(written["llama", "Q4_1"][0], lambda stage, f: seen.append(f))
    assert seen[-1] == 1.0 and seen == sorted(seen)


def test_unsupported_tensor_type(tmp_path: Path) -> None:
    path = tmp_path / "q5_0.gguf"
    ckpt_gguf.write_gguf(path, CONFIGS["llama"], qtype="Q5_0")
    message = r"q5_0\.gguf: tensor blk\.0\.\w+\.weight has type Q5_0, which is not supported"
    with pytest.raises(ModelError, match=message):
        load_model(path)


def test_unknown_architecture(tmp_path: Path) -> None:
    path = tmp_path / "falcon.gguf"
    w = gguf.GGUFWriter(str(path), "falcon")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="falcon.gguf: GGUF architecture 'falcon' is not supported"):
        load_config(path)


def test_unknown_pre_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "pre.gguf"
    ckpt_gguf.write_gguf(path, CONFIGS["llama"], pre="mystery")
    with pytest.raises(ModelError, match="pre-tokenizer 'mystery' is not supported"):
        load_model(path)


def test_truncated_and_garbage_files(written, tmp_path: Path) -> None:
    data = written["llama", "Q4_1"][0].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="cut.gguf: not a readable GGUF file"):
        load_model(cut)
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:100])
    with pytest.raises(ModelError, match="head.gguf: not a readable GGUF file"):
        load_config(head)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(ModelError, match="junk.gguf: not a GGUF file"):
        load_model(junk)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no such file or folder"):
        load_model(tmp_path / "nope.gguf")


# --- mutated files: every field checked, one line naming the file and the key ---------------------

def rewritten(src: Path, dst: Path, kv: dict | None = None, drop: tuple = (), tensors=None) -> Path:
    """`src` with some metadata replaced ({key: (GGUF value type, value)}), removed, or other tensors."""
    kvs, ts = ff.read_gguf(src)
    kvs = [k for k in kvs if k.key not in (kv or {}) and k.key not in drop]
    kvs += [ff.KV(key, vtype, value) for key, (vtype, value) in (kv or {}).items()]
    ff.write_gguf(dst, kvs, ts if tensors is None else tensors(ts))
    return dst


@pytest.mark.parametrize("key, value, words", [
    ("llama.rope.freq_base", (ff.STR, "10000"), "metadata llama.rope.freq_base must be a number in"),
    ("llama.context_length", (ff.ARR, (ff.U32, [1, 2])), r"metadata llama.context_length must be an integer"),
    ("tokenizer.ggml.merges", (ff.ARR, (ff.I32, [1, 2, 3])), "metadata tokenizer.ggml.merges must be a list of strs"),
    ("tokenizer.ggml.merges", (ff.ARR, (ff.STR, ["ab"])), "tokenizer.ggml.merges must be a list of 'left right'"),
    ("tokenizer.ggml.eos_token_id", (ff.F32, 2.5), r"tokenizer.ggml.eos_token_id must be an integer in 0..\d+"),
    ("tokenizer.ggml.eos_token_id", (ff.U32, 10**9), "tokenizer.ggml.eos_token_id must be an integer in"),
    ("llama.rope.dimension_count", (ff.I32, -1), r"metadata llama.rope.dimension_count must be an integer in 0..4096"),
    ("llama.rope.dimension_count", (ff.U32, 18), r"the rotary dimension must be even and in 2..16"),
    ("llama.rope.dimension_count", (ff.U32, 3), r"the rotary dimension must be even"),
    ("llama.block_count", (ff.U32, 2_000_000), r"metadata llama.block_count must be an integer in 1..1024"),
    ("llama.attention.head_count", (ff.U32, 0), r"metadata llama.attention.head_count must be an integer in 1"),
    ("llama.attention.layer_norm_rms_epsilon", (ff.F32, math.nan), "rms_epsilon must be a number"),
    ("tokenizer.ggml.tokens", (ff.ARR, (ff.STR, [b"\xff\xfe"] * 3)), "metadata tokenizer.ggml.tokens is unreadable"),
    ("tokenizer.chat_template", (ff.I32, 5), "metadata tokenizer.chat_template must be a string"),
    ("general.architecture", (ff.I32, 1), "metadata general.architecture must be a string"),
])
def test_mutated_metadata_is_one_line_naming_the_key(written, tmp_path: Path, key, value, words) -> None:
    path = rewritten(written["llama", "Q4_1"][0], tmp_path / "m.gguf", {key: value})
    with pytest.raises(ModelError, match="m.gguf: .*" + words) as e:
        load_model(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("change, words", [
    (lambda ts: [t for t in ts if t.name != "blk.1.ffn_up.weight"], "missing tensor layers.1.mlp.up_proj"),
    (lambda ts: ts + [ff.GTensor("blk.0.attn_q.bias", [64], 0, bytes(256))], "an attention bias without the others"),
    (lambda ts: [ff.GTensor(t.name, [t.dims[0], 0], t.ggml_type, b"") if t.name == "blk.1.attn_output.weight" else t
                 for t in ts], r"tensor blk.1.attn_output.weight has shape \[0, 64\]"),
])
def test_mutated_tensors(written, tmp_path: Path, change, words) -> None:
    path = rewritten(written["llama", "Q8_0"][0], tmp_path / "t.gguf", tensors=change)
    with pytest.raises(ModelError, match=words):
        load_model(path)


def test_a_huge_count_in_the_header_is_a_clean_error(written, tmp_path: Path) -> None:
    data = bytearray(written["llama", "Q4_1"][0].read_bytes())
    for at in (8, 16):  # the tensor count, the metadata count
        bad = tmp_path / f"count{at}.gguf"
        bad.write_bytes(bytes(data[:at]) + (2**40).to_bytes(8, "little") + bytes(data[at + 8:]))
        with pytest.raises(ModelError, match="not a readable GGUF file"):
            load_model(bad)


META = {"general.architecture": "llama", "llama.embedding_length": 64, "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2, "llama.block_count": 2, "llama.feed_forward_length": 128,
        "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 10000.0, "llama.context_length": 512,
        "llama.rope.dimension_count": 16, "llama.attention.key_length": 16, "llama.vocab_size": 320}
# qwen35moe as llama.cpp writes it: the Gated DeltaNet's ssm.* keys, the layer pattern, MTP, experts
HYBRID = {"general.architecture": "qwen35moe", **{k.replace("llama.", "qwen35moe."): v for k, v in META.items()
                                                  if k != "general.architecture"},
          "qwen35moe.block_count": 5, "qwen35moe.attention.key_length": 16, "qwen35moe.attention.value_length": 16,
          "qwen35moe.rope.dimension_sections": [4, 2, 2, 0], "qwen35moe.ssm.conv_kernel": 4,
          "qwen35moe.ssm.state_size": 8, "qwen35moe.ssm.group_count": 2, "qwen35moe.ssm.time_step_rank": 4,
          "qwen35moe.ssm.inner_size": 32, "qwen35moe.full_attention_interval": 4,
          "qwen35moe.nextn_predict_layers": 1, "qwen35moe.expert_count": 4, "qwen35moe.expert_used_count": 2,
          "qwen35moe.expert_feed_forward_length": 64, "qwen35moe.expert_shared_feed_forward_length": 64}
ANY = st.none() | st.booleans() | st.integers(-2**66, 2**66) | st.floats() | st.text(max_size=6) \
    | st.lists(st.integers(-2, 2) | st.text(max_size=2), max_size=3) | st.sampled_from([2_000_000, 1024, 16, 17])


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([META, HYBRID]).flatmap(
    lambda base: st.tuples(st.just(base), st.dictionaries(st.sampled_from(sorted(base)), ANY, min_size=1, max_size=4))))
def test_config_from_any_metadata_is_valid_or_one_model_error(base_changes) -> None:
    from engine.loader.gguf import config_from_metadata
    base, changes = base_changes
    meta = {k: v for k, v in {**base, **changes}.items() if v is not None}
    try:
        c = config_from_metadata(meta, {"output.weight"}, "/m.gguf")
    except ModelError as e:
        assert str(e).startswith("/m.gguf: ") and "\n" not in str(e)
        return
    assert 1 <= c.layers <= 1024 and c.heads % c.kv_heads == 0 and 2 <= c.rotary_dim <= c.head_dim
    assert c.rotary_dim % 2 == 0 and c.rms_eps > 0 and math.isfinite(c.rope_theta) and c.vocab >= 1
    assert len(c.layer_types) == c.layers and 0 <= c.mtp_layers <= 16
    if c.linear_layers:
        assert min(c.lin_k_heads, c.lin_v_heads, c.lin_k_dim, c.lin_v_dim, c.conv_kernel) >= 1
        assert c.lin_v_heads % c.lin_k_heads == 0 and c.state_bytes_per_stream() > 0
    if c.experts:
        assert 1 <= c.top_k <= c.experts and c.expert_intermediate >= 1


def test_the_hybrid_metadata_of_the_property_test_is_a_model():
    """The property test's qwen35moe base must itself load, or its changes would test nothing."""
    from engine.loader.gguf import config_from_metadata
    c = config_from_metadata(HYBRID, {"output.weight"}, "/m.gguf")
    assert (c.arch, c.layers, c.mtp_layers, c.experts, len(c.linear_layers)) == ("qwen3_5_moe", 4, 1, 4, 3)


# --- the real default model (skipped until `python -m engine fetch-default`) -----------------------

@pytest.fixture(scope="module")
def default_path() -> Path:
    path = default_model_path()
    if not path.is_file():
        pytest.skip(f"default model not downloaded ({path}); `python -m engine fetch-default`")
    return path


def test_default_model(default_path: Path) -> None:
    assert describe(None) == "SmolLM2-135M-Instruct · llama · 30 layers · GGUF Q4_1"
    m = load_model(None)
    c = m.config
    assert (c.hidden, c.layers, c.heads, c.kv_heads, c.head_dim, c.vocab, c.intermediate) == (
        576, 30, 9, 3, 64, 49152, 1536)
    assert c.tie_embeddings and "lm_head" not in m.weights and c.rope_theta == 100000.0
    emb, q = m.weights["embed_tokens"], m.weights["layers.0.self_attn.q_proj"]
    assert isinstance(emb, Affine) and emb.bits == 8 and isinstance(q, Affine) and q.bits == 4
    t = {t.name: t for t in gguf.GGUFReader(default_path).tensors}["blk.7.attn_k.weight"]
    raw = gguf.quants.dequantize(t.data, t.tensor_type)
    raw = raw.reshape(3, 32, 2, 576).swapaxes(1, 2).reshape(192, 576)
    np.testing.assert_array_equal(dequantize(m.weights["layers.7.self_attn.k_proj"]), raw)
