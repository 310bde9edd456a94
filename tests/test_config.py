"""ModelConfig from a Hugging Face config: every field typed and range-checked, errors naming the
file and the field; a hypothesis property over arbitrary values in every field."""
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import FULL, LINEAR, ModelConfig
from engine.errors import ModelError

import ckpt

BASES = {"llama": ckpt.tiny_llama_config(), "qwen3": ckpt.tiny_qwen3_config(), "qwen3_5": ckpt.tiny_qwen3_5_config(),
         "qwen3_5_moe": ckpt.tiny_qwen3_5_moe_config()}
JSONISH = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True) \
    | st.text(max_size=8) | st.lists(st.integers(-3, 3) | st.text(max_size=3) | st.none(), max_size=4) \
    | st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=2) | st.sampled_from([FULL, LINEAR, 2_000_000])


def fields_of(cfg: dict) -> list[tuple]:
    out = [(k,) for k in cfg]
    for nest in ("text_config", "rope_parameters"):
        if isinstance(cfg.get(nest), dict):
            out += [(nest, k) for k in cfg[nest]] + [(nest, k, j) for k, v in cfg[nest].items()
                                                      if isinstance(v, dict) for j in v]
    return out


def invariants(c: ModelConfig) -> None:
    assert 1 <= c.layers <= 1024 and len(c.layer_types) == c.layers
    assert all(t in (FULL, LINEAR) for t in c.layer_types)
    for name in ("hidden", "heads", "kv_heads", "head_dim", "vocab"):
        v = getattr(c, name)
        assert isinstance(v, int) and not isinstance(v, bool) and v >= 1, name
    assert c.heads % c.kv_heads == 0 and c.rotary_dim % 2 == 0 and 2 <= c.rotary_dim <= c.head_dim
    assert math.isfinite(c.rms_eps) and c.rms_eps > 0 and math.isfinite(c.rope_theta) and c.rope_theta > 0
    if c.linear_layers:
        assert c.lin_k_heads >= 1 and c.lin_v_heads % c.lin_k_heads == 0 and c.conv_kernel >= 1
    if c.experts:
        assert c.arch == "qwen3_5_moe" and 1 <= c.top_k <= c.experts
    assert isinstance(c.tie_embeddings, bool) and isinstance(c.attn_output_gate, bool)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(BASES)), st.data(), st.lists(JSONISH, min_size=1, max_size=3))
def test_any_value_in_any_field_is_a_valid_config_or_a_model_error_naming_the_file(arch, data, values):
    cfg = json.loads(json.dumps(BASES[arch]))
    for value in values:
        path = data.draw(st.sampled_from(fields_of(cfg)))
        target = cfg
        for k in path[:-1]:
            target = target[k]
        target[path[-1]] = value
    try:
        c = ModelConfig.from_hf(cfg, "/m/config.json")
    except ModelError as e:
        assert str(e).startswith("/m/config.json: ") and "\n" not in str(e)
        return
    invariants(c)


@pytest.mark.parametrize("field, value, words", [
    ("num_hidden_layers", "2", "field num_hidden_layers must be an integer in 1..1024, got '2'"),
    ("num_hidden_layers", 2_000_000, "field num_hidden_layers must be an integer in 1..1024, got 2000000"),
    ("num_hidden_layers", math.inf, "num_hidden_layers must be an integer"),
    ("vocab_size", 2**64, "field vocab_size must be an integer in 1..4194304, got 18446744073709551616"),
    ("vocab_size", -math.inf, "vocab_size must be an integer"),
    ("num_attention_heads", 0, "field num_attention_heads must be an integer in 1..1024, got 0"),
    ("num_attention_heads", True, "num_attention_heads must be an integer"),
    ("rope_theta", "1e4", "field rope_theta must be a number"),
    ("rms_norm_eps", math.nan, "field rms_norm_eps must be a number"),
    ("tie_word_embeddings", "false", "field tie_word_embeddings must be true or false"),
    ("num_key_value_heads", 3, "4 attention heads do not divide into 3 kv heads"),
    ("head_dim", 15, "the rotary dimension must be even"),
])
def test_broken_llama_fields_name_the_file_and_field(field, value, words):
    cfg = {**ckpt.tiny_llama_config(), field: value}
    with pytest.raises(ModelError, match="^/m/config.json: .*" + words.replace("(", r"\(").replace("..", r"\.\.")):
        ModelConfig.from_hf(cfg, "/m/config.json")


@pytest.mark.parametrize("change, words", [
    ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]},
     r"layer_types\[1\] is 'sliding_attention'"),
    ({"layer_types": ["linear_attention", 7, "linear_attention", "full_attention"]},
     "field text_config.layer_types must be a list of at most 4 strings"),
    ({"layer_types": ["full_attention"]}, "layer_types has 1 entries for 4 layers"),
    ({"layer_types": None, "full_attention_interval": 0},
     "field text_config.full_attention_interval must be an integer in 1..4"),
    ({"linear_num_value_heads": 3}, "3 linear value heads do not divide into 2 key heads"),
    ({"rope_parameters": {"partial_rotary_factor": 2.0}}, r"rope_parameters.partial_rotary_factor must be a number in"),
    ({"rope_parameters": "fast"}, "field text_config.rope_parameters must be an object"),
])
def test_broken_qwen3_5_fields(change, words):
    cfg = ckpt.tiny_qwen3_5_config()
    cfg["text_config"].update(change)
    with pytest.raises(ModelError, match=words):
        ModelConfig.from_hf(cfg, "config.json")


def test_experts_only_where_the_architecture_has_them():
    with pytest.raises(ModelError, match="a llama model has no experts"):
        ModelConfig.from_hf({**ckpt.tiny_llama_config(), "num_experts": 4, "num_experts_per_tok": 2})
    moe = ckpt.tiny_qwen3_5_moe_config()
    moe["text_config"]["num_experts_per_tok"] = 9
    with pytest.raises(ModelError, match="num_experts_per_tok must be an integer in 0..8"):
        ModelConfig.from_hf(moe)


def test_text_config_that_is_not_an_object():
    with pytest.raises(ModelError, match="field text_config must be an object, got"):
        ModelConfig.from_hf({"model_type": "qwen3_5", "text_config": [1, 2]}, "config.json")
