"""MLX affine-quantized folders: weight/scales/biases → Affine, per-module overrides, mlx-lm's renames
and layouts (shifted norms, conv1d [C, K, 1], switch_mlp), and the errors for inconsistent files."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.errors import ModelError
from engine.loader import describe, load_config, load_model
from engine.weights import Affine, dequantize

import ckpt


def canonical(mlx_name: str) -> str:
    for old, new in (("language_model.model.", ""), ("language_model.lm_head", "lm_head"), ("model.", "")):
        if mlx_name.startswith(old):
            mlx_name = new + mlx_name[len(old):]
            break
    return mlx_name.removesuffix(".weight").replace("switch_mlp", "experts")


def set_quant(folder: Path, **changes) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg["quantization"].update(changes)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("bits, group", [(4, 32), (8, 64), (4, 64), (2, 32)])
def test_llama_affine(tmp_path: Path, bits: int, group: int) -> None:
    ref = ckpt.write_mlx(tmp_path, ckpt.tiny_llama_config(), seed=1, bits=bits, group=group)
    m = load_model(tmp_path)
    assert m.format == "mlx" and describe(tmp_path).endswith(f"MLX {bits}-bit g{group}")
    assert set(m.weights) == {canonical(n) for n in ref}
    for name, value in ref.items():
        w = m.weights[canonical(name)]
        if value.ndim == 2:
            assert isinstance(w, Affine) and (w.bits, w.group) == (bits, group), name
        np.testing.assert_array_equal(dequantize(w), value, err_msg=name)


def test_overrides(tmp_path: Path) -> None:
    over = {"model.layers.0.mlp.down_proj": {"bits": 8, "group_size": 64},
            "model.embed_tokens": {"bits": 8, "group_size": 32}}
    ref = ckpt.write_mlx(tmp_path, ckpt.tiny_qwen3_config(), seed=2, bits=4, group=32, overrides=over)
    m = load_model(tmp_path)
    down, emb, up = m.weights["layers.0.mlp.down_proj"], m.weights["embed_tokens"], m.weights["layers.0.mlp.up_proj"]
    assert (down.bits, down.group, emb.bits, emb.group, up.bits, up.group) == (8, 64, 8, 32, 4, 32)
    np.testing.assert_array_equal(dequantize(down), ref["model.layers.0.mlp.down_proj.weight"])


def test_qwen3_5_matches_hf_layout(tmp_path: Path) -> None:
    """mlx-lm's converted layout loads to the same canonical tensors as the HF original."""
    cfg = ckpt.tiny_qwen3_5_config()
    ckpt.write_hf(tmp_path / "hf", cfg, seed=3, dtype="f32")
    ref = ckpt.write_mlx(tmp_path / "mlx", cfg, seed=3, bits=8, group=32)
    hf, mlx = load_model(tmp_path / "hf"), load_model(tmp_path / "mlx")
    assert mlx.config.mtp_layers == 0 and load_config(tmp_path / "mlx").mtp_layers == 0  # mlx-lm drops mtp
    assert set(mlx.weights) == {n for n in hf.weights if not n.startswith("mtp.")}
    for name in ("layers.0.input_layernorm", "norm", "layers.3.self_attn.k_norm", "layers.2.linear_attn.norm",
                 "layers.1.linear_attn.conv1d", "layers.1.linear_attn.A_log"):
        # stored bf16 in the MLX folder, so equal to the HF float32 value up to bf16 rounding
        np.testing.assert_allclose(mlx.weights[name], hf.weights[name], rtol=2 ** -8, err_msg=name)
    assert mlx.weights["layers.1.linear_attn.conv1d"].shape == (2 * 32 + 64, 4)
    np.testing.assert_array_equal(dequantize(mlx.weights["lm_head"]), ref["language_model.lm_head.weight"])


def test_qwen3_5_moe_switch_mlp(tmp_path: Path) -> None:
    cfg = ckpt.tiny_qwen3_5_moe_config()
    ref = ckpt.write_mlx(tmp_path, cfg, seed=4, bits=4, group=32,
                         overrides={f"language_model.model.layers.{i}.mlp.gate": {"bits": 8, "group_size": 64}
                                    for i in range(4)})
    m = load_model(tmp_path)
    gate = m.weights["layers.2.mlp.experts.gate_proj"]
    assert isinstance(gate, Affine) and gate.shape == (8, 32, 64) and gate.packed.shape == (8, 32, 8)
    stored = ref["language_model.model.layers.2.mlp.switch_mlp.gate_proj.weight"]
    np.testing.assert_array_equal(dequantize(gate), stored)
    assert m.weights["layers.2.mlp.gate"].bits == 8


def test_group_must_divide_input(tmp_path: Path) -> None:
    ckpt.write_mlx(tmp_path, ckpt.tiny_llama_config(), bits=4, group=32)
    set_quant(tmp_path, group_size=48)
    with pytest.raises(ModelError, match=r"model.safetensors: tensor model.\S+.weight: group size 48 does not divide "
                                         r"the input dimension (64|128)"):
        load_model(tmp_path)


def test_scales_disagree_with_config(tmp_path: Path) -> None:
    ckpt.write_mlx(tmp_path, ckpt.tiny_llama_config(), bits=4, group=32)
    set_quant(tmp_path, group_size=64)
    with pytest.raises(ModelError, match=r"tensor model.\S+.scales has shape \[\d+, \d+\], but 4-bit groups of 64"):
        load_model(tmp_path)


def test_bits_disagree_with_shapes(tmp_path: Path) -> None:
    ckpt.write_mlx(tmp_path, ckpt.tiny_llama_config(), bits=4, group=32)
    set_quant(tmp_path, bits=8)
    with pytest.raises(ModelError, match="shape"):
        load_model(tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"mode": "mxfp4"}, "MLX quantization mode 'mxfp4' is not supported"),
    ({"bits": 3}, r"3-bit quantization \(quantization.bits\) is not supported"),
    ({"group_size": 0}, r"field quantization.group_size must be an integer in 1..65536, got 0"),
])
def test_unsupported_quantization(tmp_path: Path, change: dict, message: str) -> None:
    ckpt.write_mlx(tmp_path, ckpt.tiny_llama_config())
    set_quant(tmp_path, **change)
    with pytest.raises(ModelError, match="config.json: " + message):
        load_model(tmp_path)


def test_scales_without_quantization_entry(tmp_path: Path) -> None:
    ckpt.write_mlx(tmp_path, ckpt.tiny_llama_config())
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["quantization"], cfg["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="quantized \\(.scales\\) but there is no 'quantization' entry"):
        load_model(tmp_path)
