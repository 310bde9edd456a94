"""The embedded default model end to end on the CPU: a real answer, and the gates."""
import numpy as np
import pytest

from engine import gates
from engine.engine import Runner, run_to_end
from engine.settings import EngineSettings, SamplingParams

pytestmark = pytest.mark.slow


def test_capital_of_france_names_paris(default_model):
    s = EngineSettings(model=default_model, backend="numpy", parallel=1, context=1024)
    r = Runner(s, log=lambda m: None)
    seq = r.sequence(1, s, [{"role": "user", "content": "What is the capital of France?"}],
                     SamplingParams(temperature=0, max_tokens=16), lambda e: None)
    done = run_to_end(r.scheduler(s), [seq])[1]
    assert "Paris" in done.text and done.text[0].isupper()


def test_fp8_kv_stays_close_to_bf16(default_model):
    s = EngineSettings(model=default_model, backend="numpy", parallel=1, context=512)
    r = Runner(s, log=lambda m: None)
    ids = r.tokenizer.encode_chat([{"role": "user", "content": "Name three colours of the rainbow."}])
    bf16 = r.scheduler(s).prompt_logits(ids)
    fp8 = r.scheduler(EngineSettings(**{**s.to_dict(), "sampling": s.sampling, "kv_dtype": "fp8"})).prompt_logits(ids)
    assert int(np.argmax(bf16)) == int(np.argmax(fp8))
    assert np.abs(bf16 - fp8).max() < 0.1 * np.abs(bf16).max()


def test_quick_gates_pass_on_the_default_model(default_model):
    s = EngineSettings(model=default_model, backend="numpy", parallel=8, context=1024)
    table = gates.run(s, gates.load_chats(None)[:4], 6, quick=True, log=lambda m: None)
    assert gates.passed(table), gates.render(table)
