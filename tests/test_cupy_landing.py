"""A snapshot file restored onto the GPU through page-locked staging: the device arrays hold the
file's bits exactly (tensors larger than a staging buffer, and more of them than buffers), a
damaged file is refused as on the host, and the lane it goes into continues bit for bit."""
import numpy as np
import pytest

from engine.kv import LaneState, Snapshot, SnapshotError, snapshots
from engine.ops import cuda_available

OK, WHY = cuda_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not OK, reason=WHY or "no GPU")]


GB_GRAPHS = True  # conftest's gb: decode steps replay captured graphs


def big_snapshot(rng) -> Snapshot:
    """Two K/V tensors of ~67 MB each (past one 64 MiB staging buffer), fp8 scales, and more
    recurrent arrays than buffers."""
    from engine.ops.cupy_landing import CHUNK
    n = CHUNK // 32 + 4099  # rows of 2 heads × 16 fp8 dims: a staging buffer and part of another
    k, v = (rng.integers(0, 1 << 8, (n, 2, 16), dtype=np.uint8) for _ in range(2))
    ks, vs = (rng.uniform(0.1, 2, (n, 2)).astype(np.float32) for _ in range(2))
    state = [(rng.standard_normal((6, 3), dtype=np.float32), rng.standard_normal((4, 8, 8), dtype=np.float32))
             for _ in range(5)]
    return Snapshot(list(range(n + 1)), n - 3, LaneState(n, "fp8", [(k, v, ks, vs)], state))


def test_a_file_lands_on_the_device_bit_exactly(gb, tmp_path):
    import cupy
    snap = big_snapshot(np.random.default_rng(0))
    path = tmp_path / "big.kv"
    snapshots.save(path, snap, "fp", 256)
    for _ in range(2):  # the staging buffers are reused by the next restore
        split = {}
        back = snapshots.load(path, "fp", "fp8", gb.landing(), split)
        assert back.tokens == snap.tokens and split["read"] > 0
        for got, want in zip(back.cache.kv + back.cache.state, snap.cache.kv + snap.cache.state):
            for g, w in zip(got, want):
                assert isinstance(g, cupy.ndarray) and g.dtype == w.dtype and g.shape == w.shape
                assert np.array_equal(cupy.asnumpy(g).view(np.uint8), w.view(np.uint8))
        host = back.cache.on_host(gb.to_host)
        assert all(isinstance(a, np.ndarray) for g in host.kv + host.state for a in g)


def test_a_damaged_file_is_refused_on_the_device_too(gb, tmp_path):
    snap = big_snapshot(np.random.default_rng(1))
    path = tmp_path / "big.kv"
    snapshots.save(path, snap, "fp", 256)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x04
    path.write_bytes(bytes(raw))
    with pytest.raises(SnapshotError, match="checksum"):
        snapshots.load(path, "fp", "fp8", gb.landing())
    path.write_bytes(bytes(raw[: len(raw) - 1000]))
    with pytest.raises(SnapshotError):
        snapshots.load(path, "fp", "fp8", gb.landing())
