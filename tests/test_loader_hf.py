"""Hugging Face safetensors folders: canonical names and layouts, Qwen3.5 conventions, shards, and one
clear ModelError for every kind of broken input."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

from engine.errors import ModelError
from engine.loader import describe, load_config, load_model
from engine.loader.safetensors_io import SafetensorsFile

import ckpt


def canonical(hf_name: str) -> str:
    for prefix in ("model.language_model.", "model."):
        hf_name = hf_name.removeprefix(prefix)
    return hf_name.removesuffix(".weight")


def rewrite(folder: Path, edit) -> None:
    """Apply `edit(tensors) -> tensors` to model.safetensors (tensors in their stored dtypes)."""
    st = SafetensorsFile(folder / "model.safetensors")
    tensors = {n: np.array(st.raw(n)) for n in st.entries}
    del st
    ckpt.write_safetensors(folder / "model.safetensors", edit(tensors))


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    (cfg.get("text_config") or cfg).update(changes)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_llama_roundtrip(tmp_path: Path, dtype: str) -> None:
    ref = ckpt.write_hf(tmp_path, ckpt.tiny_llama_config(), seed=5, dtype=dtype)
    m = load_model(tmp_path)
    assert m.format == "hf" and m.config.tie_embeddings and "lm_head" not in m.weights
    assert set(m.weights) == {canonical(n) for n in ref}
    for name, value in ref.items():
        w = m.weights[canonical(name)]
        assert w.dtype == np.float32
        np.testing.assert_array_equal(w, value, err_msg=name)
    assert describe(tmp_path) == f"{tmp_path.name} · llama · 2 layers · HF {dtype}"


def test_writer_is_real_safetensors(tmp_path: Path) -> None:
    """The test writer's files read back through the official safetensors library."""
    ref = ckpt.write_hf(tmp_path, ckpt.tiny_qwen3_config(), seed=1, dtype="f32")
    with safe_open(str(tmp_path / "model.safetensors"), framework="numpy") as f:
        assert set(f.keys()) == set(ref)
        np.testing.assert_array_equal(f.get_tensor("lm_head.weight"), ref["lm_head.weight"])


def test_qwen3(tmp_path: Path) -> None:
    ref = ckpt.write_hf(tmp_path, ckpt.tiny_qwen3_config(), seed=2)
    m = load_model(tmp_path)
    assert m.config.arch == "qwen3" and m.config.qk_norm and not m.config.tie_embeddings
    np.testing.assert_array_equal(m.weights["layers.2.self_attn.k_norm"], ref["model.layers.2.self_attn.k_norm.weight"])
    np.testing.assert_array_equal(m.weights["lm_head"], ref["lm_head.weight"])


def test_qwen3_5_conventions(tmp_path: Path) -> None:
    ref = ckpt.write_hf(tmp_path, ckpt.tiny_qwen3_5_config(), seed=4)
    rewrite(tmp_path, lambda t: {**t, "model.visual.blocks.0.attn.qkv.weight": np.zeros((8, 8), np.float32)})
    m = load_model(tmp_path)
    c = m.config
    assert c.arch == "qwen3_5" and c.linear_layers == [0, 1, 2] and c.attention_layers == [3] and c.mtp_layers == 1
    p = "model.language_model."
    # zero-centred norms get +1, the gated DeltaNet norm does not
    for name in ("layers.0.input_layernorm", "layers.3.self_attn.q_norm", "norm", "mtp.norm",
                 "mtp.layers.0.post_attention_layernorm"):
        stored = ref.get(p + name + ".weight", ref.get(name + ".weight"))
        np.testing.assert_array_equal(m.weights[name], stored + 1, err_msg=name)
    np.testing.assert_array_equal(m.weights["layers.1.linear_attn.norm"], ref[p + "layers.1.linear_attn.norm.weight"])
    conv = ref[p + "layers.0.linear_attn.conv1d.weight"]
    np.testing.assert_array_equal(m.weights["layers.0.linear_attn.conv1d"], conv[:, 0, :])
    np.testing.assert_array_equal(m.weights["layers.2.linear_attn.A_log"], ref[p + "layers.2.linear_attn.A_log"])
    assert m.weights["layers.3.self_attn.q_proj"].shape == (2 * 4 * 32, 64)  # query and gate per head
    assert not any("visual" in n for n in m.weights)
    assert "mtp.fc" in m.weights and "lm_head" in m.weights


def test_qwen3_5_moe_fused_and_per_expert(tmp_path: Path) -> None:
    cfg = ckpt.tiny_qwen3_5_moe_config()
    ref = ckpt.write_hf(tmp_path / "fused", cfg, seed=6)
    m = load_model(tmp_path / "fused")
    gu = ref["model.language_model.layers.1.mlp.experts.gate_up_proj"]
    np.testing.assert_array_equal(m.weights["layers.1.mlp.experts.gate_proj"], gu[:, :32])
    np.testing.assert_array_equal(m.weights["layers.1.mlp.experts.up_proj"], gu[:, 32:])
    assert m.weights["layers.1.mlp.experts.down_proj"].shape == (8, 64, 32)
    assert m.weights["layers.0.mlp.shared_expert_gate"].shape == (1, 64)

    def per_expert(t: dict) -> dict:
        out = {}
        for name, v in t.items():
            if name.endswith("experts.gate_up_proj"):
                for e in range(v.shape[0]):
                    out[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = v[e, :32]
                    out[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = v[e, 32:]
            elif name.endswith("experts.down_proj"):
                for e in range(v.shape[0]):
                    out[name.replace("down_proj", f"{e}.down_proj.weight")] = v[e]
            else:
                out[name] = v
        return out

    ckpt.write_hf(tmp_path / "split", cfg, seed=6)
    rewrite(tmp_path / "split", per_expert)
    m2 = load_model(tmp_path / "split")
    assert set(m2.weights) == set(m.weights)
    for name in m.weights:
        np.testing.assert_array_equal(m2.weights[name], m.weights[name], err_msg=name)


def test_sharded(tmp_path: Path) -> None:
    ref = ckpt.write_hf(tmp_path, ckpt.tiny_qwen3_config(), seed=7)
    st = SafetensorsFile(tmp_path / "model.safetensors")
    tensors = {n: np.array(st.raw(n)) for n in st.entries}
    del st
    (tmp_path / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, members in shards.items():
        ckpt.write_safetensors(tmp_path / file, {n: tensors[n] for n in members})
    index = {"metadata": {}, "weight_map": {n: f for f, ms in shards.items() for n in ms}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    m = load_model(tmp_path)
    for name, value in ref.items():
        np.testing.assert_array_equal(m.weights[canonical(name)], value)


def test_load_config_and_path_forms(tmp_path: Path) -> None:
    ckpt.write_hf(tmp_path, ckpt.tiny_qwen3_5_moe_config(), seed=0)
    c = load_config(tmp_path / "config.json")  # a file inside the folder stands for the folder
    assert (c.arch, c.experts, c.top_k, c.expert_intermediate, c.rotary_dim, c.mtp_layers) == (
        "qwen3_5_moe", 8, 2, 32, 8, 1)
    assert load_config(tmp_path / "model.safetensors").layers == 4


def test_tokenizer_and_eos(tmp_path: Path) -> None:
    ckpt.write_hf(tmp_path, ckpt.tiny_llama_config())
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    tok = load_model(tmp_path).tokenizer
    assert tok.eos_ids == {0, 2} and tok.bos_id == 1 and tok.eos_token == "<|im_end|>"


def test_progress(tmp_path: Path) -> None:
    ckpt.write_hf(tmp_path, ckpt.tiny_llama_config())
    seen = []
    load_model(tmp_path, lambda stage, f: seen.append((stage, f)))
    assert seen[0][1] == 0.0 and seen[-1] == ("loading weights", 1.0)


# --- broken input: one ModelError line naming the file and the problem ----------------------------

@pytest.fixture
def llama(tmp_path: Path) -> Path:
    ckpt.write_hf(tmp_path, ckpt.tiny_llama_config(), seed=1)
    return tmp_path


def test_missing_things(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no such file or folder"):
        load_model(tmp_path / "absent")
    with pytest.raises(ModelError, match="not a model folder"):
        load_model(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelError, match="notes.txt: not a GGUF file"):
        load_model(tmp_path / "notes.txt")


def test_truncated_safetensors(llama: Path) -> None:
    f = llama / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ModelError, match=r"model.safetensors: tensor \S+: data ends at byte \d+ but the file has only"):
        load_model(llama)
    f.write_bytes(b"\x05\x00")
    with pytest.raises(ModelError, match="model.safetensors: truncated safetensors file"):
        load_model(llama)


def _header(f: Path) -> tuple[dict, bytes]:
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _put(f: Path, header: dict, data: bytes) -> None:
    h = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(h)) + h + data)


@pytest.mark.parametrize("lie, message", [
    (lambda e: e.update(data_offsets=[e["data_offsets"][0], 10**9]), "data ends at byte 1000000000"),
    (lambda e: e.update(shape=[e["shape"][0] * 2, e["shape"][1]]),
     r"shape \[640, 64\] of BF16 needs 81920 bytes but the header gives 40960"),
    (lambda e: e.update(dtype="F12"), "unknown dtype 'F12'"),
    (lambda e: e.update(shape=[-1, 4]), "bad shape"),
    (lambda e: e.update(data_offsets=[100, 50]), "bad data_offsets"),
])
def test_lying_header(llama: Path, lie, message: str) -> None:
    f = llama / "model.safetensors"
    header, data = _header(f)
    lie(header["model.embed_tokens.weight"])
    _put(f, header, data)
    with pytest.raises(ModelError, match=r"model.safetensors: tensor model.embed_tokens.weight: " + message):
        load_model(llama)


def test_header_garbage(llama: Path) -> None:
    f = llama / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 10) + b"{not json}" + b"\0" * 64)
    with pytest.raises(ModelError, match="model.safetensors: header is not valid JSON"):
        load_model(llama)
    f.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ModelError, match="header length 1099511627776 does not fit"):
        load_model(llama)


def test_unknown_architecture(llama: Path) -> None:
    edit_config(llama, model_type="gpt_neox")
    with pytest.raises(ModelError, match="config.json: unknown architecture 'gpt_neox'"):
        load_model(llama)


def test_missing_and_misshapen_tensors(llama: Path) -> None:
    rewrite(llama, lambda t: {n: v for n, v in t.items() if "layers.1.mlp.up_proj" not in n})
    with pytest.raises(ModelError, match="missing tensor layers.1.mlp.up_proj"):
        load_model(llama)
    ckpt.write_hf(llama, ckpt.tiny_llama_config(), seed=1)
    edit_config(llama, intermediate_size=96)
    with pytest.raises(ModelError, match=r"model.safetensors: tensor model.layers.0.mlp.\w+_proj.weight: shape "
                                         r"\[\d+, \d+\], but the config implies"):
        load_model(llama)


def test_tokenizer_larger_than_model(tmp_path: Path) -> None:
    cfg = {**ckpt.tiny_llama_config(), "vocab_size": 256}
    ckpt.write_hf(tmp_path, cfg)
    message = r"tokenizer.json: the tokenizer has token id 299 but the model's vocabulary is 256"
    with pytest.raises(ModelError, match=message):
        load_model(tmp_path)


def test_integer_weight_refused(llama: Path) -> None:
    rewrite(llama, lambda t: {**t, "model.norm.weight": t["model.norm.weight"].astype(np.int32)})
    with pytest.raises(ModelError, match="tensor model.norm.weight has dtype I32, expected a float type"):
        load_model(llama)


def test_other_quantization_refused(llama: Path) -> None:
    cfg = json.loads((llama / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (llama / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="quantization method 'gptq' is not supported"):
        load_model(llama)


def test_bf16_values_widen_exactly(tmp_path: Path) -> None:
    ref = ckpt.write_hf(tmp_path, ckpt.tiny_llama_config(), seed=9, dtype="bf16")
    w = load_model(tmp_path).weights["embed_tokens"]
    assert np.array_equal(w.astype(ml_dtypes.bfloat16).astype(np.float32), w)
    np.testing.assert_array_equal(w, ref["model.embed_tokens.weight"])


# --- mutated folders: every JSON capped, every field checked --------------------------------------

@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json"])
def test_json_nested_deep_is_a_clean_error(llama: Path, name: str) -> None:
    (llama / name).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelError, match=f"{name}: .*nested more than 64 levels"):
        load_model(llama)


def test_safetensors_header_nested_deep(llama: Path) -> None:
    _put(llama / "model.safetensors", {}, b"")
    deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    (llama / "model.safetensors").write_bytes(struct.pack("<Q", len(deep)) + deep)
    with pytest.raises(ModelError, match="header is not valid JSON .*nested more than 64 levels"):
        load_model(llama)


@pytest.mark.parametrize("eos, words", [
    ([[2]], "generation_config.json: field eos_token_id must be a token id or a list"),
    (2.5, "field eos_token_id must be a token id"),
    ([2, "x"], "field eos_token_id must be"),
    (10**6, r"end-of-sequence id 1000000 is outside the model's vocabulary \(0..319\)"),
])
def test_bad_eos_ids(llama: Path, eos, words: str) -> None:
    (llama / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    with pytest.raises(ModelError, match=words):
        load_model(llama)


def test_null_eos_ids_are_none(llama: Path) -> None:
    (llama / "generation_config.json").write_text(json.dumps({"eos_token_id": None}))
    assert load_model(llama).tokenizer.eos_ids  # the tokenizer_config's eos token still stands


@pytest.mark.parametrize("template, words", [
    (["{{ x }}", 5], "field chat_template must be a string or a list of"),
    ([{"name": "default", "template": 7}], "field chat_template must be a string or a list of"),
    (12, "field chat_template must be a string or a list of named templates, got 12"),
])
def test_chat_template_of_the_wrong_type(llama: Path, template, words: str) -> None:
    path = llama / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "chat_template": template}))
    with pytest.raises(ModelError, match="tokenizer_config.json: " + words):
        load_model(llama)


@pytest.mark.parametrize("extra, words", [
    ("model.layers.0.self_attn.q_proj.bias", "an attention bias without the others"),
    ("model.layers.7.mlp.up_proj.weight", None),  # a tensor of no layer the config has: dropped
    ("model.unused.weight", None),
])
def test_header_declaring_a_tensor_nothing_uses(llama: Path, extra: str, words) -> None:
    rewrite(llama, lambda t: {**t, extra: np.ones(64, np.float32)})
    if words is None:
        assert extra.removeprefix("model.").removesuffix(".weight") in load_model(llama).meta["dropped"]
    else:
        with pytest.raises(ModelError, match=words):
            load_model(llama)


@pytest.mark.parametrize("field, value", [("num_hidden_layers", "2"), ("vocab_size", float("inf")),
                                          ("num_attention_heads", 2**64), ("num_hidden_layers", 2_000_000)])
def test_config_values_of_the_wrong_type_or_range(llama: Path, field: str, value) -> None:
    edit_config(llama, **{field: value})
    with pytest.raises(ModelError, match=f"config.json: field {field} must be an integer"):
        load_model(llama)


def test_huge_layer_count_and_generation_config_do_not_hang(llama: Path) -> None:
    edit_config(llama, num_hidden_layers=2_000_000)
    (llama / "generation_config.json").write_text(json.dumps({"eos_token_id": list(range(2_000_000))}))
    with pytest.raises(ModelError, match="num_hidden_layers must be an integer in 1..1024"):
        load_model(llama)
    edit_config(llama, num_hidden_layers=2)
    with pytest.raises(ModelError, match="generation_config.json: .*more than the 1048576 bytes"):
        load_model(llama)


def test_layer_types_entry_that_is_no_layer_kind(tmp_path: Path) -> None:
    cfg = ckpt.tiny_qwen3_5_config()
    ckpt.write_hf(tmp_path, cfg)
    edit_config(tmp_path, layer_types=["linear_attention", "attention", "linear_attention", "full_attention"])
    with pytest.raises(ModelError, match=r"config.json: layer_types\[1\] is 'attention'"):
        load_model(tmp_path)


@pytest.mark.parametrize("weight_map", [{"model.norm.weight": "../outside.safetensors"}, [1], {"x": 5}])
def test_shard_index_cannot_point_outside_the_folder(llama: Path, weight_map) -> None:
    (llama / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ModelError, match="model.safetensors.index.json: "):
        load_model(llama)


@pytest.mark.parametrize("key", ["eos_token", "bos_token"])
def test_special_token_with_a_lone_surrogate(llama: Path, key: str) -> None:
    path = llama / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: "\ud800"}))
    with pytest.raises(ModelError, match=f"tokenizer_config.json: field {key} must be a token string"):
        load_model(llama)
