"""The capped JSON reader every engine and app reader goes through: size and depth before parsing."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import jsonfile

values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ ab\n'),
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                      max_leaves=30)


def true_depth(v) -> int:
    if isinstance(v, list):
        return 1 + max(map(true_depth, v), default=0)
    if isinstance(v, dict):
        return 1 + max(map(true_depth, v.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(values)
def test_depth_counts_nesting_and_ignores_brackets_in_strings(v):
    assert jsonfile.depth(json.dumps(v).encode()) == true_depth(v)


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000,
                                  "[" * 100_000])
def test_deep_json_is_refused_before_parsing(text):
    with pytest.raises(jsonfile.JSONLimitError, match="nested more than 64 levels"):
        jsonfile.loads(text)


def test_limits_are_the_callers(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"a": [[[1]]], "pad": "x" * 2000}))
    assert jsonfile.read(path)["a"] == [[[1]]]
    with pytest.raises(jsonfile.JSONLimitError, match="more than the 1000 bytes"):
        jsonfile.read(path, max_bytes=1000)
    with pytest.raises(jsonfile.JSONLimitError, match="nested more than 2"):
        jsonfile.read(path, max_depth=2)


def test_a_long_string_costs_no_more_than_its_bytes():
    # a per-character regex alternation kept a backtracking entry per character: gigabytes for 20 MB
    text = json.dumps({"pad": "x\\\"[" * (5 << 20)})
    assert jsonfile.depth(text.encode()) == 1
