"""Sampling is keyed by (seed, absolute position): reproducible, and honours top-k / top-p."""
import numpy as np

from engine.sampling import sample, uniform
from engine.settings import SamplingParams


def test_same_seed_and_position_same_token():
    logits = np.random.default_rng(0).normal(size=500).astype(np.float32)
    p = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=7)
    assert [sample(logits, p, pos) for pos in range(50)] == [sample(logits, p, pos) for pos in range(50)]
    assert len({sample(logits, p, pos) for pos in range(200)}) > 20
    assert uniform(7, 3) != uniform(8, 3) and 0 <= uniform(7, 3) < 1


def test_top_k_and_top_p_limit_the_choice():
    logits = np.linspace(0, 5, 100).astype(np.float32)
    top = set(np.argsort(-logits)[:3])
    k = SamplingParams(temperature=2.0, top_k=3, top_p=1.0)
    assert {sample(logits, k, pos) for pos in range(300)} <= top
    peaked = np.zeros(100, np.float32)
    peaked[42] = 20
    assert {sample(peaked, SamplingParams(temperature=1.0, top_p=0.5, top_k=0), pos) for pos in range(100)} == {42}


def test_greedy_is_argmax_with_lowest_index_on_ties():
    logits = np.array([1, 3, 3, 2], np.float32)
    assert sample(logits, SamplingParams(temperature=0), 0) == 1
