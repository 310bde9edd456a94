"""The gate suite on tiny models, and proof that it fails when a stream sees another's rows."""
import json
from dataclasses import replace

import numpy as np
import pytest

from engine import gates
from engine.drafters.dflash2_config import SYNTHETIC
from engine.engine import Runner
from engine.ops.numpy_backend import NumpyBackend
from engine.settings import EngineSettings, SamplingParams


def test_resume_and_cache_rows_at_the_seeds_first_offset(tmp_path):
    """A prompt ending at 4796 (context 16384, a checkpoint whose positions reach 32768): its
    follow-up through a snapshot file and its shared prefixes through the prompt cache."""
    from ckpt import tiny_llama_config, write_hf
    cfg = tiny_llama_config()
    cfg["max_position_embeddings"] = 32768
    write_hf(tmp_path, cfg, seed=0)
    s = EngineSettings(model=str(tmp_path), backend="numpy", parallel=8, context=16384)
    table = gates.run(s, [], 2, True, log=lambda m: None, offsets=[4796], dtypes=("fp8",))
    assert gates.passed(table), gates.render(table)
    col = table[f"{tmp_path.name} fp8"]
    assert col["resumed from disk == uninterrupted"] == (3, 3) and col["prompt-cache hit == cold"] == (6, 6)


def run(name: str, quick: bool = True, max_tokens: int = 12):
    s = EngineSettings(model=f"synthetic:{name}", backend="numpy", parallel=8, context=1024)
    return gates.run(s, gates.load_chats(None), max_tokens, quick, log=lambda m: None)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_every_gate_passes_on_tiny_models(name):
    table = run(name, quick=False)
    assert set(table) == {f"{name} bf16", f"{name} fp8"}
    assert gates.passed(table), gates.render(table)
    col = table[f"{name} bf16"]
    assert col["concurrent 1/2/4/8 == solo"][1] == 5 * 15  # five arms × 1+2+4+8
    assert col["all == contiguous (solo)"][1] >= 2 * 16


def test_gates_catch_a_stream_reading_another_lane(monkeypatch):
    real = NumpyBackend.attention

    def leaky(self, q, cache, layer, tables, positions, prompt=False, window=1, fp16=False):
        if not prompt and len(q) > 1:  # decode rows all read the first row's lane
            tables = np.repeat(tables[:1], len(q), axis=0)
            positions = np.minimum(positions, positions[0])
        return real(self, q, cache, layer, tables, positions, prompt, window, fp16)

    monkeypatch.setattr(NumpyBackend, "attention", leaky)
    table = run("tiny-llama")
    assert not gates.passed(table)
    passed, total = table["tiny-llama bf16"]["concurrent 1/2/4/8 == solo"]
    assert passed < total


def test_prompt_file_replaces_the_builtin_set(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps([[{"role": "user", "content": "hi"}], [{"role": "system", "content": "x"},
                                                                     {"role": "user", "content": "yo"}]]))
    assert len(gates.load_chats(str(f))) == 2
    f.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(Exception, match="expected a JSON list"):
        gates.load_chats(str(f))


def test_gates_cli_prints_the_table(capsys):
    from engine.__main__ import main
    assert main(["gates", "--model", "synthetic:tiny-qwen3", "--backend", "numpy", "--quick", "--max-tokens", "6"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "gate\ttiny-qwen3 bf16\ttiny-qwen3 fp8"
    assert any(line.startswith("drafted == plain: dflash2") for line in out)  # a synthetic model's random drafter
    assert all(cell.split("/")[0] == cell.split("/")[1] for line in out[1:] for cell in line.split("\t")[1:])


def test_drafted_rows_for_every_drafter_that_fits():
    """n-gram, MTP and DFlash2 (random weights: mostly rejected) and the oracle (all accepted),
    paged against contiguous, on a hybrid model; a model without an MTP head gates the others, and
    DFlash2 runs only with a checkpoint."""
    s = EngineSettings(model="synthetic:tiny-qwen3.5", backend="numpy", parallel=8, context=256,
                       drafter_model=SYNTHETIC)
    runner = Runner(s, log=lambda m: None)
    assert gates.fitting(runner, gates.DRAFTERS, SYNTHETIC) == ["ngram", "mtp", "dflash2", "oracle"]
    assert gates.fitting(runner, gates.DRAFTERS) == ["ngram", "mtp", "oracle"]
    prompts = gates.prompt_set(runner, gates.load_chats(None)[:2], s.context, 6)
    outs = {name: gates.run_arm(runner, replace(s, paging=paging, page_tokens=page), prompts, 6, gates.DRAFTERS)
            for name, paging, page in (gates.ARMS[0], gates.ARMS[3])}
    rows = gates.compare(outs["contiguous"], outs)
    drafted = {r: v for r, v in rows.items() if r.startswith("drafted == plain")}
    assert len(drafted) == 4 and all(p == t == 2 * (len(prompts) + 8) for p, t in drafted.values()), rows
    llama = Runner(replace(s, model="synthetic:tiny-llama"), log=lambda m: None)
    assert gates.fitting(llama, gates.DRAFTERS, SYNTHETIC) == ["ngram", "dflash2", "oracle"]



def test_the_cache_row_reaches_past_a_large_prefill_chunk():
    """Hits land on multiples of max(chunk, page): with 1,024-row chunks the shared prompt is
    lengthened past 1,024 so the row still proves a hit; a context too short for it is refused."""
    s = EngineSettings(model="synthetic:tiny-llama", backend="numpy", parallel=8, context=2048, prefill_chunk=1024)
    runner = Runner(s, log=lambda m: None)
    prompts = gates.prompt_set(runner, gates.load_chats(None)[:2], s.context, 4)
    assert max(map(len, prompts)) < 1024
    shared = gates.shared_prefixes(runner, prompts, gates.cache_granule(runner, s), s.context)
    assert len(shared[0]) > 1024 and shared[1] == shared[0] and shared[2][:100] == shared[0][:100]
    outs = {name: gates.cache_hits(runner, replace(s, paging=paging, page_tokens=page), prompts,
                                   SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
            for name, paging, page in (gates.ARMS[0], gates.ARMS[1])}
    assert outs["pages p16"][("cache-reused",)] >= 1024
    assert gates.compare(outs["contiguous"], outs)["prompt-cache hit == cold"] == (3, 3)
    with pytest.raises(Exception, match="raise --context above"):
        gates.run(replace(s, context=1024), gates.load_chats(None)[:2], 4, True, log=lambda m: None)
