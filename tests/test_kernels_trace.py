"""kernels/trace.py's summary of stamped graph replays, without a GPU (the stamps themselves: the
GPU test of `bench --trace` in tests/test_bench.py)."""
import numpy as np

from kernels.trace import summary


def stamps(*ns):
    return np.array([len(ns), *ns], np.uint64)


def test_each_launch_is_charged_until_the_next_one_and_classes_add_up():
    names = ["a (1,)", "b (2,)", "a (1,)", "c (1,)"]
    lines = summary("1 row", names, [stamps(1000, 4000, 5000, 9000), stamps(2000, 5000, 6000, 10000)])
    assert lines[0] == ("trace: graph of 1 row, 2 replays, 4 launches, first to last launch 8.0 µs; "
                        "by launch class, µs a step (launches x µs each):")
    rows = [line.split() for line in lines[1:]]  # the last launch (c) has no stamp after it
    assert rows == [["7.0", "2", "x", "3.50", "a", "(1,)"], ["1.0", "1", "x", "1.00", "b", "(2,)"]]
    assert sum(float(r[0]) for r in rows) == 8.0


def test_replays_missing_a_stamp_are_left_out_and_said():
    names = ["a", "b"]
    short = np.array([1, 5, 0], np.uint64)  # one launch did not stamp
    lines = summary("8 rows", names, [short, stamps(0, 3000)])
    assert lines[0].startswith("trace: graph of 8 rows, 1 replays, 2 launches, first to last launch 3.0 µs")
    assert summary("8 rows", names, [short]) == ["trace: graph of 8 rows: no replay stamped all 2 launches ([1])"]
