"""The oracle proposes a known run's next tokens to a stream on the way to it, nothing to any other."""
from types import SimpleNamespace

from engine.drafters.oracle import OracleDrafter


def seq(tokens):
    return SimpleNamespace(tokens=list(tokens))


def test_proposes_the_known_continuation():
    o = OracleDrafter([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]])
    o.learn([1, 2, 3, 4, 5, 6, 7, 8, 20, 21])
    assert o.propose(seq([1, 2, 3, 4, 5, 6, 7, 8, 9]), 3) == [10, 11]
    assert o.propose(seq([1, 2, 3, 4, 5, 6, 7, 8]), 2) == [9, 10]
    assert o.propose(seq([1, 2, 3, 4, 5, 6, 7, 8, 20]), 5) == [21]


def test_other_streams_get_nothing():
    o = OracleDrafter([[1, 2, 3, 4]])
    assert o.propose(seq([1, 2, 5]), 3) == []
    assert o.propose(seq([1, 2, 3, 4]), 3) == []  # the run's end
    assert OracleDrafter().propose(seq([1]), 3) == []
