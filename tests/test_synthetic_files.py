"""A synthetic model written as an MLX folder loads back to the very same weights."""
import numpy as np
import pytest

from engine.loader import describe, load_model
from engine.synthetic import synthetic
from engine.synthetic_files import write
from engine.weights import dequantize


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3.5", "tiny-qwen3.5-moe"])
def test_written_folder_loads_the_same_weights(tmp_path, name):
    folder = write(tmp_path / name, name, seed=3)
    loaded, made = load_model(folder), synthetic(name, seed=3)
    assert loaded.format == "mlx" and describe(folder).endswith("MLX 4-bit g32")
    assert loaded.config.layer_types == made.config.layer_types and set(loaded.weights) == set(made.weights)
    for n, w in made.weights.items():
        np.testing.assert_array_equal(dequantize(loaded.weights[n]), dequantize(w), err_msg=n)
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("héllo <|im_end|>")) == "héllo <|im_end|>"
