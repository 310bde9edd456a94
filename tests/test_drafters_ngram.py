"""Prompt lookup: the continuation of the latest earlier match of the longest tail that has one."""
from types import SimpleNamespace

import pytest

from engine.drafters.ngram import NgramDrafter


def seq(tokens):
    return SimpleNamespace(tokens=list(tokens))


def test_longest_tail_latest_match():
    d = NgramDrafter(longest=3, shortest=2)
    # tail [7, 8, 9] matches at 0 (followed by 1, 2); [8, 9] alone would match later (followed by 5)
    assert d.propose(seq([7, 8, 9, 1, 2, 8, 9, 5, 7, 8, 9]), 2) == [1, 2]
    # only the 2-gram [8, 9] matches: its latest earlier occurrence wins
    assert d.propose(seq([8, 9, 4, 8, 9, 5, 6, 8, 9]), 3) == [5, 6, 8]


def test_no_match_and_short_streams_propose_nothing():
    d = NgramDrafter()
    assert d.propose(seq([1, 2, 3, 4, 5]), 4) == []
    assert d.propose(seq([1]), 4) == []
    assert d.propose(seq([3, 3]), 4) == []  # a tail of 2 needs an earlier 2-gram with a token after it


def test_continuation_stops_at_the_stream_end():
    assert NgramDrafter().propose(seq([5, 6, 7, 5, 6]), 8) == [7, 5, 6]


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError, match="shortest <= longest"):
        NgramDrafter(longest=1, shortest=2)
