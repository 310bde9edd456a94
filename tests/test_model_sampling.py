"""The sampling a model recommends: generation_config.json, GGUF general.sampling.*, the embedded
default's model card; wrong types and ranges are left out."""
import json
import shutil

import pytest

from engine import default_model_path, model_sampling_defaults


@pytest.fixture
def folder(tmp_path, app_model):
    dest = tmp_path / "model"
    shutil.copytree(app_model, dest)
    return dest


def write(folder, raw) -> None:
    (folder / "generation_config.json").write_text(raw if isinstance(raw, str) else json.dumps(raw))


def test_the_embedded_default_uses_its_model_cards_values(default_model):
    assert model_sampling_defaults(None) == {"temperature": 0.2, "top_p": 0.9}
    assert model_sampling_defaults(default_model) == {"temperature": 0.2, "top_p": 0.9}
    assert str(default_model_path()) == default_model


def test_a_generation_config_is_read(folder):
    assert model_sampling_defaults(str(folder)) == {}
    write(folder, {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": 2})
    assert model_sampling_defaults(str(folder)) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    write(folder, {"do_sample": False, "temperature": 0.6})
    assert model_sampling_defaults(str(folder)) == {"temperature": 0.0}  # the makers decode greedily


@pytest.mark.parametrize("raw", ['{"temperature": "hot", "top_p": 2, "top_k": -1}', "[1, 2]", "{broken",
                                 '{"temperature": NaN, "top_p": true, "top_k": 1.5}', "[" * 100000 + "]" * 100000])
def test_bad_values_are_left_out(folder, raw):
    write(folder, raw)
    assert model_sampling_defaults(str(folder)) == {}


def test_gguf_sampling_keys(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_float32("general.sampling.temp", 0.5)
    writer.add_float32("general.sampling.top_p", 0.75)
    writer.add_int32("general.sampling.top_k", 30)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    got = model_sampling_defaults(str(path))
    assert got == {"temperature": 0.5, "top_p": 0.75, "top_k": 30}


def test_an_unreadable_model_recommends_nothing(tmp_path):
    assert model_sampling_defaults(str(tmp_path / "nothing-here")) == {}
