"""The models folder (engine.installed): what is installed and how big, when last used, deleting."""
from pathlib import Path

import pytest

from engine import installed
from engine.errors import ModelError

import ckpt
import ckpt_gguf


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LANECHAT_HOME", str(tmp_path / "home"))
    from engine.paths import models_dir
    folder = models_dir()
    ckpt.write_hf(folder / "tiny-hf", ckpt.tiny_qwen3_config(), seed=0)
    ckpt.write_mlx(folder / "tiny-mlx", ckpt.tiny_qwen3_5_config(), bits=4, group=32)
    ckpt_gguf.write_gguf(folder / "Tiny-Q8_0.gguf", ckpt.tiny_llama_config(), qtype="Q8_0")
    (folder / "broken").mkdir()
    (folder / "broken" / "config.json").write_text("{")
    (folder / "notes.txt").write_text("not a model")
    return folder


def test_listing(models):
    by_name = {m.path.name: m for m in installed.listing()}
    assert set(by_name) == {"tiny-hf", "tiny-mlx", "Tiny-Q8_0.gguf", "broken"}
    hf, mlx, gg = by_name["tiny-hf"], by_name["tiny-mlx"], by_name["Tiny-Q8_0.gguf"]
    assert (hf.format, hf.arch, hf.max_context) == ("HF bf16", "qwen3", 512)
    assert (mlx.format, mlx.arch) == ("MLX 4-bit g32", "qwen3_5")
    assert (gg.format, gg.name, gg.arch) == ("GGUF Q8_0", "Tiny", "llama")
    assert hf.size_bytes == sum(p.stat().st_size for p in (models / "tiny-hf").iterdir())
    assert gg.size_bytes == (models / "Tiny-Q8_0.gguf").stat().st_size
    broken = by_name["broken"]
    assert broken.error and broken.format == "" and broken.size_bytes == 1
    assert all(m.last_used is None for m in by_name.values())


def test_last_used_and_recent(models):
    installed.mark_used(models / "tiny-hf", when=100.0)
    installed.mark_used(models / "Tiny-Q8_0.gguf", when=200.0)
    by_name = {m.path.name: m for m in installed.listing()}
    assert by_name["tiny-hf"].last_used == 100.0 and by_name["Tiny-Q8_0.gguf"].last_used == 200.0
    assert installed.recent() == [(models / "Tiny-Q8_0.gguf").resolve(), (models / "tiny-hf").resolve()]
    (installed.paths.state_dir() / installed.USED_FILE).write_text("[1, 2")  # a damaged file forgets, never fails
    assert installed.recent() == []


def test_entries_no_view_can_show_are_forgotten(models):
    """A NUL in a path made Path.exists raise, and 10**400, inf or NaN seconds broke float() and the
    dates shown: the Recent models menu failed at every start."""
    good = str((models / "tiny-hf").resolve())
    raw = ('{"/x\\u0000y": 1.0, "": 2.0, "/a": 1e999, "/b": NaN, "/c": -5, "/d": 10' + "0" * 400
           + f', "/e": true, "/f": "1", "{good}": 300.5}}')
    (installed.paths.state_dir() / installed.USED_FILE).write_text(raw)
    assert installed.recent() == [Path(good)]
    assert {m.path.name: m.last_used for m in installed.listing()}["tiny-hf"] == 300.5


def test_models_used_from_elsewhere_follow_the_folders_newest_first(models, tmp_path):
    lm_studio = tmp_path / "lmstudio"
    lm_studio.mkdir()
    ckpt_gguf.write_gguf(lm_studio / "Old-Q8_0.gguf", ckpt.tiny_llama_config(), qtype="Q8_0")
    ckpt_gguf.write_gguf(lm_studio / "New-Q4_0.gguf", ckpt.tiny_llama_config(), qtype="Q4_0")
    installed.mark_used(lm_studio / "Old-Q8_0.gguf", when=100.0)
    installed.mark_used(lm_studio / "New-Q4_0.gguf", when=300.0)
    installed.mark_used(models / "tiny-hf", when=200.0)  # in the folder: listed once, with the folder's
    listed = installed.listing()
    assert [m.path.name for m in listed if not m.in_folder] == ["New-Q4_0.gguf", "Old-Q8_0.gguf"]
    assert [m.path.name for m in listed].count("tiny-hf") == 1 and listed[-1].format == "GGUF Q8_0"
    assert [m.path.name for m in installed.listing(recent_limit=1) if not m.in_folder] == ["New-Q4_0.gguf"]
    with pytest.raises(ModelError, match="only those are deleted here"):
        installed.delete(lm_studio / "New-Q4_0.gguf")


def test_a_model_linked_into_the_folder_is_listed_once(models, tmp_path):
    elsewhere = tmp_path / "downloads"
    elsewhere.mkdir()
    ckpt_gguf.write_gguf(elsewhere / "Linked-Q8_0.gguf", ckpt.tiny_llama_config(), qtype="Q8_0")
    (models / "Linked-Q8_0.gguf").symlink_to(elsewhere / "Linked-Q8_0.gguf")
    installed.mark_used(elsewhere / "Linked-Q8_0.gguf", when=100.0)
    listed = [m for m in installed.listing() if m.path.name == "Linked-Q8_0.gguf"]
    assert len(listed) == 1 and listed[0].in_folder


def test_delete_only_inside_the_models_folder(models, tmp_path):
    installed.mark_used(models / "tiny-hf")
    installed.delete(models / "tiny-hf")
    installed.delete(models / "Tiny-Q8_0.gguf")
    assert not (models / "tiny-hf").exists() and not (models / "Tiny-Q8_0.gguf").exists()
    assert installed.recent() == []
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for bad in (outside, models, models / "tiny-mlx" / "config.json", models / "gone"):
        with pytest.raises(ModelError, match="only those are deleted here"):
            installed.delete(bad)
    assert outside.exists() and (models / "tiny-mlx" / "config.json").exists()
