"""EngineSettings and SamplingParams refuse what cannot work (NaN, inf, wrong types, out of range)
with a PlanError naming the value; a hypothesis property over every field."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import PlanError
from engine.settings import EngineSettings, SamplingParams

ANY = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=5) \
    | st.lists(st.text(max_size=3) | st.integers(), max_size=20)


def ok_number(v, low, high, open_low=False):
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and (v > low if open_low else v >= low) and v <= high)


def ok_int(v, low, high):
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from(["temperature", "top_p", "top_k", "max_tokens", "seed", "stop", "ignore_eos"]),
                       ANY, max_size=3))
def test_sampling_params_are_valid_or_refused(fields):
    p = SamplingParams(**fields)
    try:
        p.validate()
    except PlanError as e:
        assert "\n" not in str(e)
        return
    assert ok_number(p.temperature, 0, 100) and ok_number(p.top_p, 0, 1, open_low=True)
    assert ok_int(p.top_k, 0, 2**31) and ok_int(p.max_tokens, 1, 2**24) and ok_int(p.seed, 0, 2**64 - 1)
    assert isinstance(p.stop, list) and all(isinstance(s, str) and s for s in p.stop)
    assert isinstance(p.ignore_eos, bool)


@pytest.mark.parametrize("field, value", [
    ("temperature", math.nan), ("temperature", math.inf), ("temperature", -0.5), ("temperature", "0.7"),
    ("top_p", 0.0), ("top_p", 1.01), ("top_p", math.nan), ("top_k", -1), ("top_k", 1.5), ("max_tokens", 0),
    ("seed", -1), ("seed", 2**64), ("stop", "END"), ("stop", [1]), ("stop", [""]), ("ignore_eos", "yes"),
])
def test_bad_sampling_values(field, value):
    with pytest.raises(PlanError, match=field.split("_")[0]):
        SamplingParams(**{field: value}).validate()


@pytest.mark.parametrize("field, value, words", [
    ("memory_gib", math.nan, "memory budget"), ("memory_gib", math.inf, "memory budget"),
    ("memory_gib", True, "memory budget"),
    ("prefill_chunk", 2**30, "prefill chunk must be a power of two from 1 to 8192"),
    ("prefill_chunk", 3, "prefill chunk"), ("parallel", 10**9, "parallel must be a whole number from 1 to 256"),
    ("parallel", 2.0, "parallel"), ("context", 2**40, "context"), ("page_tokens", 2**20, "page size"),
    ("backend", ["numpy"], "backend"), ("model", "", "model must be a path"), ("kv_dtype", None, "kv dtype"),
    ("drafter", "dflash9", "drafter must be one of none, ngram, mtp, dflash2, oracle"),
    ("drafter_model", "", "drafter model must be a folder path"), ("drafter_model", 3, "drafter model"),
    ("draft_tokens", 0, "draft tokens must be a whole number from 1 to 16"), ("draft_tokens", 17, "draft tokens"),
    ("draft_tokens", True, "draft tokens"),
])
def test_bad_engine_settings(field, value, words):
    with pytest.raises(PlanError, match=words):
        EngineSettings(**{field: value}).validate()


def test_settings_files_of_the_wrong_shape():
    with pytest.raises(PlanError, match="settings must be an object"):
        EngineSettings.from_dict({"sampling": [1]})
    assert EngineSettings.from_dict({"parallel": 3, "unknown": 1, "sampling": {"seed": 5}}).validate().parallel == 3


def test_the_prefill_chunk_is_the_backends_unless_one_is_set():
    s = EngineSettings().validate()
    assert s.prefill_chunk == 0 and s.with_chunk(512).prefill_chunk == 512
    assert EngineSettings(prefill_chunk=64).with_chunk(512).prefill_chunk == 64
