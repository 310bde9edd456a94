"""Snapshot files: a round trip is bit-exact, and every damaged, foreign or mismatched file is
refused with a reason, never continued from; a failed write leaves the old file whole."""
import os
import subprocess
import sys
import threading
from functools import lru_cache

import numpy as np
import pytest

from engine import Engine, EngineSettings, Finished, SamplingParams, Started
from engine.engine import Runner, run_to_end
from engine.kv import SnapshotError, snapshots

import fuzz_files as ff

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def settings(**kw) -> EngineSettings:
    return EngineSettings(**{**dict(model="synthetic:tiny-qwen3.5", backend="numpy", parallel=2, context=256,
                                    paging="all", page_tokens=16, prefill_chunk=16, memory_gib=1), **kw})


@lru_cache(maxsize=None)
def runner() -> Runner:
    return Runner(settings(), log=lambda m: None)


def turn(s: EngineSettings, ids: list[int], resume=None):
    r = runner()
    sched = r.scheduler(s)
    seq = r.sequence(1, s, None, GREEDY, lambda e: None, ids, resume=resume, snapshot_at_end=True)
    run_to_end(sched, [seq])
    return seq, sched.snapshots.pop(1), sched


PROMPT = [1] + list(range(20, 60))


@pytest.fixture
def saved(tmp_path):
    s = settings()
    _, snap, _ = turn(s, PROMPT)
    path = tmp_path / "c.kv"
    snapshots.save(path, snap, runner().fingerprint, s.page_tokens)
    return path, snap


def test_a_round_trip_is_bit_exact(saved):
    path, snap = saved
    back = snapshots.load(path, runner().fingerprint, "bf16")
    assert back.tokens == snap.tokens and back.prompt_len == snap.prompt_len and back.cache.n == snap.cache.n
    for a, b in zip(back.cache.kv + back.cache.state, snap.cache.kv + snap.cache.state):
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and np.array_equal(x.view(np.uint8), y.view(np.uint8))


class Staged:
    """A landing with small page-locked-like staging, as the GPU's: every tensor passes through
    `SLOTS` buffers of `chunk_bytes` and reaches its destination only at `land`."""
    chunk_bytes = 1000  # odd, so that chunks split tensors mid-row
    grain_bytes = 64  # and grains split chunks
    SLOTS = 2

    def __init__(self):
        self.staging = [np.zeros(self.chunk_bytes, np.uint8) for _ in range(self.SLOTS)]
        self.slot, self.landed, self.finished = 0, 0, 0

    def empty(self, shape, dtype):
        a = np.empty(shape, dtype)
        a.reshape(-1).view(np.uint8)[:] = 0x5A  # what a byte no copy reached would show
        return a

    def chunk(self, dest, offset, nbytes):
        return memoryview(self.staging[self.slot])[:nbytes]

    def land(self, dest, offset, buf):
        dest.reshape(-1).view(np.uint8)[offset:offset + buf.nbytes] = np.frombuffer(buf, np.uint8)
        self.slot = (self.slot + 1) % self.SLOTS
        self.landed += buf.nbytes

    def finish(self):
        self.finished += 1


@pytest.fixture(params=["host", "staged"])
def landing(request):
    return snapshots.HOST if request.param == "host" else Staged()


def _same(back, snap):
    assert back.tokens == snap.tokens and back.prompt_len == snap.prompt_len and back.cache.n == snap.cache.n
    for a, b in zip(back.cache.kv + back.cache.state, snap.cache.kv + snap.cache.state):
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x.view(np.uint8), y.view(np.uint8))


def test_every_landing_reads_the_file_bit_exactly_in_one_pass(saved, landing):
    path, snap = saved
    split = {}
    back = snapshots.load(path, runner().fingerprint, "bf16", landing, split)
    _same(back, snap)
    assert set(split) == {"read", "check", "land"} and all(v >= 0 for v in split.values())
    if isinstance(landing, Staged):
        tokens = 4 * len(snap.tokens)  # the ids land on the host whatever the landing
        assert landing.landed == snap.cache.nbytes == path.stat().st_size - tokens - _header_end(path)
        assert landing.finished == 1


def _header_end(path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


def test_a_file_cut_short_while_it_is_read_is_refused_and_its_copies_awaited(saved):
    """The file checked whole at open and truncated before its bytes are read (another writer)."""
    path, _ = saved

    class Cutting(Staged):
        def empty(self, shape, dtype):
            os.truncate(path, _header_end(path) + 10)
            return super().empty(shape, dtype)

    cut = Cutting()
    with pytest.raises(SnapshotError, match="truncated"):
        snapshots.load(path, runner().fingerprint, "bf16", cut)
    assert cut.finished == 1


def test_a_tensor_of_a_dtype_no_snapshot_has_is_refused(saved):
    path, _ = saved
    header, data = ff.read_safetensors(path)
    header["kv.0.0"]["dtype"] = "BF16"  # the same bytes, a type the file never holds
    ff.write_safetensors(path, header, data)
    with pytest.raises(SnapshotError, match="BF16"):
        snapshots.load(path, runner().fingerprint, "bf16")


def test_a_follow_up_computes_only_the_new_turn_and_equals_the_unpaused_stream(saved):
    path, snap = saved
    s = settings()
    ids = snap.tokens + [30, 31, 32, 33, 34]
    mem, _, _ = turn(s, ids, resume=snap)
    disk, _, sched = turn(s, ids, resume=snapshots.load(path, runner().fingerprint, "bf16"))
    assert disk.tokens == mem.tokens
    assert sched.prompt_positions == len(ids) - snap.cache.n  # only what follows the snapshot
    other = turn(s, PROMPT[:-3] + [99] * 10, resume=snap)[2]  # another branch: recomputed from 0
    assert other.prompt_positions == len(PROMPT) - 3 + 10


@pytest.mark.parametrize("damage", ["truncate", "flip", "header", "first"])
def test_damaged_files_are_refused(saved, damage, landing):
    path, _ = saved
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "flip":
        raw[-100] ^= 0x10
    elif damage == "first":  # the first data byte: the bytes of a tensor read before any other
        raw[_header_end(path)] ^= 0x01
    else:
        raw[10] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(SnapshotError):
        snapshots.load(path, runner().fingerprint, "bf16", landing)


def test_foreign_files_are_refused(saved, tmp_path):
    path, _ = saved
    with pytest.raises(SnapshotError, match="another model"):
        snapshots.load(path, "0" * 32, "bf16")
    with pytest.raises(SnapshotError, match="fp8"):
        snapshots.load(path, runner().fingerprint, "fp8")
    other = tmp_path / "x.kv"
    other.write_bytes(b"not a safetensors file at all")
    with pytest.raises(SnapshotError, match="unreadable"):
        snapshots.load(other, runner().fingerprint, "bf16")


def _narrow(meta, t):
    t["kv.0.0"] = np.ascontiguousarray(t["kv.0.0"][..., :8])


def _float_rows(meta, t):
    t["kv.0.1"] = t["kv.0.1"].astype(np.float32)


def _state(meta, t):
    t["state.0.0"] = np.ascontiguousarray(t["state.0.0"][..., :1])


def _all_rows(meta, t):  # a reply's last token was never fed: no row can hold it
    meta["n"] = str(len(t["tokens"]))
    for name in [n for n in t if n.startswith("kv.")]:
        t[name] = np.concatenate([t[name], t[name][-1:]])


def _layers(meta, t):
    meta["kv_layers"] = "1"


@pytest.mark.parametrize("change", [_narrow, _float_rows, _state, _all_rows, _layers])
def test_a_file_whose_contents_lie_is_refused_before_any_stream_runs(saved, change):
    """A file with its checksum made to fit and contents no cache of this model holds: its K/V
    went into the lane at admission, where the error killed the engine thread (or a decode read
    past the tokens)."""
    path, snap = saved
    ff.rewrite_snapshot(path, change)
    s = settings()
    with pytest.raises(SnapshotError):
        back = snapshots.load(path, runner().fingerprint, "bf16")
        seq = runner().sequence(1, s, None, GREEDY, lambda e: None, back.tokens + [40, 41], resume=back)
        runner().scheduler(s).add(seq)


def test_a_failed_write_leaves_the_old_file_whole(saved):
    """A file-size limit stands for a full disk: the write fails, the old snapshot still loads."""
    path, _ = saved
    before = path.read_bytes()
    code = f"""
import resource, signal, sys
from pathlib import Path
import numpy as np
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
from engine.kv import LaneState, Snapshot, snapshots
rows = np.ones((64, 2, 16), np.uint16)
snap = Snapshot(list(range(65)), 60, LaneState(64, "bf16", [(rows, rows)], []))
try:
    snapshots.save(Path({str(path)!r}), snap, "f", 16)
except OSError:
    sys.exit(3)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert done.returncode == 3, done.stderr.decode()
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    snapshots.load(path, runner().fingerprint, "bf16")


def test_prune_removes_the_oldest_past_the_budget(tmp_path):
    import os
    for i, name in enumerate(["a.kv", "b.kv", "c.kv"]):
        (tmp_path / name).write_bytes(b"x" * 100)
        os.utime(tmp_path / name, (1000 + i, 1000 + i))
    (tmp_path / ".c.kv.x1y2.tmp").write_bytes(b"half")  # a write a kill cut short
    removed = snapshots.prune(tmp_path, 250, keep=tmp_path / "a.kv")
    assert sorted(p.name for p in removed) == [".c.kv.x1y2.tmp", "b.kv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.kv", "c.kv"]


def test_the_engine_resumes_a_conversation_across_a_restart(tmp_path):
    """Engine 1 answers and writes its snapshot; engine 2 (a new process's worth of state) goes
    on from the file and computes only the new turn; a damaged file is deleted and recomputed."""
    path = tmp_path / "snapshots" / "conv.kv"
    first = Engine(settings(), log=lambda m: None)
    first.start()
    done, wrote = threading.Event(), []
    rid = first.submit(None, GREEDY, lambda e: isinstance(e, Finished) and done.set(), prompt_ids=PROMPT,
                       snapshot_at_end=True)
    assert done.wait(30)
    saved = threading.Event()
    first.save_snapshot(rid, path, 1 << 30, lambda err: (wrote.append(err), saved.set()))
    assert saved.wait(30) and wrote == [None] and path.is_file()
    first.shutdown()

    def reply_to(eng, ids):
        got, end = [], threading.Event()
        eng.submit(None, GREEDY, lambda e: (got.append(e), isinstance(e, Finished) and end.set()), prompt_ids=ids,
                   resume=path)
        assert end.wait(30)
        return next(e for e in got if isinstance(e, Started)), got[-1]

    logs = []
    second = Engine(settings(), log=logs.append)
    scheds = []
    second.on_scheduler = scheds.append
    second.start()
    snap = snapshots.load(path, second.runner.fingerprint, "bf16")
    ids = snap.tokens + [40, 41, 42]
    started, end = reply_to(second, ids)
    assert started.reused == snap.cache.n and scheds[0].prompt_positions == len(ids) - snap.cache.n
    good = path.read_bytes()
    path.write_bytes(good[:-64])  # damaged: ignored, deleted, recomputed
    again, end2 = reply_to(second, ids)
    assert again.reused == 0 and not path.exists() and end2.tokens == end.tokens == GREEDY.max_tokens
    assert any("snapshot ignored" in line for line in logs)
    path.write_bytes(good)
    ff.rewrite_snapshot(path, _narrow)  # whole, but not this model's cache: the same, and the engine goes on
    third, end3 = reply_to(second, ids)
    assert third.reused == 0 and not path.exists() and end3.tokens == end.tokens
    assert any("does not fit" in line or "another shape" in line for line in logs)
    second.shutdown()
