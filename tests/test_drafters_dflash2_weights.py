"""DFlash2 checkpoints on disk: what the writer stores loads back as written, the fixture model
drafts with one, and a checkpoint that is missing, foreign, lying or broken is refused at start
with the loader's reason while the engine runs plain."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.config import ModelConfig
from engine.drafters.dflash2_config import synthetic_config
from engine.drafters.dflash2_weights import random_tensors, read, stored_name
from engine.engine import Runner, run_to_end
from engine.errors import ModelError
from engine.settings import EngineSettings, SamplingParams

from ckpt import write_dflash2

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def qwen():
    s = EngineSettings(model="synthetic:tiny-qwen3.5", backend="numpy", parallel=2, context=128, paging="all",
                       page_tokens=16, drafter="dflash2", draft_tokens=5)
    return Runner(s, log=lambda m: None), s


def tokens(r: Runner, s: EngineSettings) -> tuple[list[int], object]:
    sched = r.scheduler(s)
    seq = r.sequence(1, s, None, GREEDY, lambda e: None, [1] + list(range(20, 40)))
    run_to_end(sched, [seq])
    return seq.tokens, sched


def test_written_weights_load_as_stored_and_draft_as_the_synthetic_drafter(qwen, tmp_path):
    r, s = qwen
    cfg = synthetic_config(r.loaded.config)
    written = write_dflash2(tmp_path / "bf16", r.loaded.config, seed=0)
    got_cfg, got = read(str(tmp_path / "bf16"), r.loaded.config)
    assert got_cfg == cfg and set(got) == set(written) == set(cfg.tensor_shapes())
    assert all(np.array_equal(np.asarray(got[n], np.float32), written[n]) for n in got)
    names = json.loads((tmp_path / "bf16" / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (tmp_path / "bf16" / "model.safetensors").read_bytes()[:8], "little")])
    assert "candidate_selector.predecessor_codebook" in names and "layers.0.attention_conv.base_kernel" in names
    assert "fc.weight" in names and stored_name("fc") == "fc.weight"
    # float32 on disk: the very weights of synthetic:dflash2, so the same drafts
    write_dflash2(tmp_path / "f32", r.loaded.config, seed=0, dtype="f32")
    plain, _ = tokens(r, replace(s, drafter="none"))
    synth, a = tokens(r, replace(s, drafter_model="synthetic:dflash2"))
    disk, b = tokens(r, replace(s, drafter_model=str(tmp_path / "f32")))
    assert plain == synth == disk
    assert a.verifier.drafter.name == b.verifier.drafter.name == "dflash2"


def test_the_fixture_model_drafts_with_a_checkpoint_of_its_hidden_size(tmp_path):
    target = ModelConfig.from_file(FIXTURES / "tiny_qwen3_5" / "config.json")
    write_dflash2(tmp_path, target, seed=3)
    s = EngineSettings(model=str(FIXTURES / "tiny_qwen3_5"), backend="numpy", parallel=2, context=128,
                       drafter="dflash2", drafter_model=str(tmp_path), draft_tokens=7)
    r = Runner(s, log=lambda m: None)
    plain, _ = tokens(r, replace(s, drafter="none"))
    drafted, sched = tokens(r, s)
    assert drafted == plain and sched.plan.drafter == "dflash2" and "drafter dflash2 (7 drafts" in sched.plan.line


def broken(kind: str, folder: Path, target: ModelConfig) -> str:
    """A checkpoint folder with one thing wrong; returns what the refusal must say."""
    cfg = synthetic_config(target)
    if kind == "missing folder":
        return f"{folder}: not a DFlash2 checkpoint folder"
    if kind == "another hidden size":
        write_dflash2(folder, target, cfg=replace(cfg, hidden=32, conv_group=8))
        return "a DFlash2 checkpoint for hidden size 32; the model's is 64"
    if kind == "no weights":
        write_dflash2(folder, target)
        (folder / "model.safetensors").unlink()
        return "no .safetensors files"
    if kind == "no config":
        write_dflash2(folder, target)
        (folder / "config.json").unlink()
        return "config.json: no such file"
    tensors = random_tensors(cfg)
    if kind == "missing tensor":
        del tensors["layers.1.mlp_conv.kernel_projection"]
        write_dflash2(folder, target, tensors=tensors)
        return "tensor layers.1.mlp_conv.kernel_projection.weight is missing"
    if kind == "lying shape":
        write_dflash2(folder, target)
        raw = json.loads((folder / "config.json").read_text())
        raw["intermediate_size"] = 96
        (folder / "config.json").write_text(json.dumps(raw))
        return "tensor layers.0.mlp.gate_proj.weight has shape [128, 64], but config.json makes it [96, 64]"
    tensors["layers.0.self_attn.k_proj"][3, 5] = np.nan
    write_dflash2(folder, target, tensors=tensors)
    return "tensor layers.0.self_attn.k_proj.weight holds NaN or infinite values"


@pytest.mark.parametrize("kind", ["missing folder", "another hidden size", "no weights", "no config",
                                  "missing tensor", "lying shape", "NaN"])
def test_a_bad_checkpoint_is_refused_at_start_and_the_engine_runs_plain(qwen, tmp_path, kind):
    r, s = qwen
    folder = tmp_path / "drafter"
    why = broken(kind, folder, r.loaded.config)
    with pytest.raises(ModelError, match="^" + re.escape(str(folder))):
        read(str(folder), r.loaded.config)
    bad = replace(s, drafter_model=str(folder))
    out, sched = tokens(r, bad)
    assert sched.verifier is None and sched.plan.drafter == "none" and sched.plan.draft_ring is None
    assert "drafter dflash2 refused: " in sched.plan.line and why in sched.plan.line
    assert sched.plan.line.endswith("; decoding plain")
    assert out == tokens(r, replace(s, drafter="none"))[0]


def test_no_checkpoint_chosen_is_refused(qwen):
    r, s = qwen
    sched = r.scheduler(replace(s, drafter_model=None))
    assert sched.verifier is None and "drafter dflash2 refused: no drafter checkpoint chosen" in sched.plan.line


def test_the_cli_starts_plain_with_a_broken_drafter_and_says_why(tmp_path, capsys):
    from engine.__main__ import main
    target = ModelConfig.from_file(FIXTURES / "tiny_qwen3_5" / "config.json")
    why = broken("NaN", tmp_path, target)
    rc = main(["generate", "--model", str(FIXTURES / "tiny_qwen3_5"), "--backend", "numpy", "--prompt", "Hi",
               "--max-tokens", "4", "--drafter", "dflash2", "--drafter-model", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 0 and "drafter dflash2 refused: " in err and why in err and "decode: 4 tokens" in err
