"""DFlash2 configs in z-lab's keys: what a v2 and a v1 config mean, the round trip of the writer's
configs, and the refusals (a config that lies or was made for another model)."""
from __future__ import annotations

import copy

import pytest

from engine.config import ModelConfig
from engine.drafters.dflash2_config import DFlashConfig, synthetic_config
from engine.errors import ModelError
from engine.synthetic import config_for

TARGET = config_for("qwen3.5-27b")[0]


def v2() -> dict:
    """A 27B drafter's config as z-lab lays one out (our numbers)."""
    return {
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "hidden_size": 5120, "num_hidden_layers": 5,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 17408,
        "vocab_size": 248320, "rms_norm_eps": 1e-6, "is_causal": False, "attention_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0},
        "layer_types": ["sliding_attention"] * 5, "sliding_window": 2048, "use_sliding_window": True,
        "num_target_layers": 64,
        "dflash_config": {"block_size": 8, "mask_token_id": 248077, "target_layer_ids": [5, 19, 33, 47, 61],
                          "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16,
                          "output_multiplier": 0.25, "final_logit_softcapping": 30.0},
    }


def test_a_v2_config_and_what_it_needs():
    c = DFlashConfig.from_hf(v2(), "config.json")
    c.check(TARGET, "x")
    assert (c.block, c.mask_id, c.target_layers, c.windows, c.causal) == (8, 248077, (5, 19, 33, 47, 61),
                                                                          (2048,) * 5, False)
    assert (c.conv_kernel, c.conv_group, c.selector_rank, c.selector_top_k, c.softcap, c.rope_theta) == (
        2, 16, 256, 16, 30.0, 1e7)
    assert c.ring(16384) == (5, 2048, 8, 128) and c.ring(1024) == (5, 1024, 8, 128)
    shapes = c.tensor_shapes()
    assert shapes["fc"] == (5120, 5 * 5120) and shapes["layers.4.mlp_conv.kernel_projection"] == (2 * 2 * 320, 5120)
    assert shapes["layers.0.attention_conv.base_kernel"] == (2, 2, 5120)
    assert shapes["candidate_selector.successor_codebook"] == (248320, 256)
    assert len(shapes) == 3 + 5 * (11 + 4) + 3


def test_a_v1_config_with_its_fields_at_the_top():
    raw = v2()
    d = raw.pop("dflash_config")
    raw.update(block_size=16, mask_token_id=d["mask_token_id"], target_layer_ids=d["target_layer_ids"])
    for k in ("layer_types", "sliding_window", "use_sliding_window", "is_causal"):
        raw.pop(k)
    c = DFlashConfig.from_hf(raw, "config.json")
    assert (c.block, c.conv_kernel, c.selector_rank, c.windows, c.causal) == (16, 0, 0, (None,) * 5, False)
    assert c.ring(4096) == (5, 4096, 8, 128) and not any("conv" in n or "selector" in n for n in c.tensor_shapes())
    # sliding layers with no word on causality attend causally, as z-lab's model does
    raw.update(layer_types=["sliding_attention"] * 5, sliding_window=512)
    assert DFlashConfig.from_hf(raw, "config.json").causal


@pytest.mark.parametrize("target", ["tiny-qwen3.5", "tiny-qwen3.5-moe", "qwen3.5-27b", "qwen3.6-35b-a3b"])
def test_synthetic_configs_fit_their_target_and_round_trip(target):
    t = config_for(target)[0]
    c = synthetic_config(t)
    c.check(t, "synthetic")
    assert DFlashConfig.from_hf(c.to_hf(), "config.json") == c
    assert all(0 <= i < t.layers for i in c.target_layers) and c.block - 1 == 7


@pytest.mark.parametrize("edit,message", [
    (lambda r: r["dflash_config"].update(target_layer_ids=[5, 5]), "distinct target layers"),
    (lambda r: r["dflash_config"].pop("target_layer_ids"), "distinct target layers"),
    (lambda r: r["dflash_config"].update(mask_token_id=248320), "mask_token_id 248320 is outside the vocabulary"),
    (lambda r: r["dflash_config"].update(conv_group_size=48), "the group dividing hidden_size 5120"),
    (lambda r: r["dflash_config"].pop("selector_top_k"), "selector_rank and selector_top_k must both be set"),
    (lambda r: r["dflash_config"].update(block_size=1), "block_size must be an integer in 2..64"),
    (lambda r: r.update(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "rope type 'yarn' is not supported"),
    (lambda r: r.update(attention_bias=True), "attention biases are not supported"),
    (lambda r: r.pop("sliding_window"), "sliding layers need a sliding_window"),
    (lambda r: r.update(num_key_value_heads=7), "32 attention heads do not divide into 7 kv heads"),
    (lambda r: r.update(hidden_size="5120"), "hidden_size must be an integer"),
])
def test_a_config_that_lies_is_refused_naming_the_field(edit, message):
    raw = copy.deepcopy(v2())
    edit(raw)
    with pytest.raises(ModelError, match=message):
        DFlashConfig.from_hf(raw, "drafter/config.json")


@pytest.mark.parametrize("edit,message", [
    (dict(hidden_size=4096, num_attention_heads=32), "a DFlash2 checkpoint for hidden size 4096; the model's is 5120"),
    (dict(vocab_size=151936), "for a vocabulary of 151936; the model's is 248320"),
])
def test_a_config_for_another_model_is_refused(edit, message):
    raw = {**v2(), **edit}
    raw["dflash_config"] = {**raw["dflash_config"], "mask_token_id": 7}
    c = DFlashConfig.from_hf(raw, "config.json")
    with pytest.raises(ModelError, match=message):
        c.check(TARGET, "drafter")
    small = ModelConfig(arch="qwen3", hidden=5120, layers=40, heads=40, kv_heads=8, head_dim=128, vocab=248320)
    with pytest.raises(ModelError, match="a DFlash2 checkpoint for a model of 64 layers; the model has 40"):
        DFlashConfig.from_hf(v2(), "config.json").check(small, "drafter")
    with pytest.raises(ModelError, match=r"target_layer_ids \[47, 61\] are not layers of the model \(0..39\)"):
        DFlashConfig.from_hf({**v2(), "num_target_layers": None}, "config.json").check(small, "drafter")
