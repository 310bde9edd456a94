"""Where the KV budget's free memory comes from: MemAvailable on the host and on unified memory,
cudaMemGetInfo on a discrete GPU; on a real device, the backend reads its own attributes."""
import pytest

from engine.memory import gpu_free_bytes, is_unified, system_free_bytes
from engine.ops import cuda_available

GIB = 1 << 30
# Device.attributes of a GB10 (DGX Spark) and an H200, the entries that matter here.
GB10 = {"Integrated": 1, "UnifiedAddressing": 1, "PageableMemoryAccess": 1,
        "PageableMemoryAccessUsesHostPageTables": 1, "MultiProcessorCount": 48}
H200 = {"Integrated": 0, "UnifiedAddressing": 1, "PageableMemoryAccess": 0, "MultiProcessorCount": 132}


def meminfo(tmp_path, available_kb: int) -> str:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       131072000 kB\nMemFree:         1000000 kB\nMemAvailable:   {available_kb} kB\n")
    return str(path)


def test_the_integrated_attribute_decides():
    assert is_unified(GB10) and not is_unified(H200) and not is_unified({})


def test_unified_memory_counts_memavailable_and_the_pool(tmp_path):
    info = meminfo(tmp_path, 100 << 20)  # 100 GiB available, page cache included
    assert gpu_free_bytes(True, device_free=7 * GIB, pool_free=GIB, meminfo=info) == 101 * GIB
    assert gpu_free_bytes(False, device_free=7 * GIB, pool_free=GIB, meminfo=info) == 8 * GIB


def test_system_free_bytes_reads_memavailable_or_falls_back(tmp_path):
    assert system_free_bytes(meminfo(tmp_path, 1234)) == 1234 * 1024
    assert system_free_bytes(str(tmp_path / "absent")) > 0  # sysconf's available pages


OK, WHY = cuda_available()


@pytest.mark.gpu
@pytest.mark.skipif(not OK, reason=WHY or "no GPU")
def test_the_backend_reads_this_device():
    import cupy

    from engine.ops.cupy_backend import CupyBackend
    b = CupyBackend()
    assert b.unified_memory == is_unified(cupy.cuda.Device().attributes)
    free, total = cupy.cuda.runtime.memGetInfo()
    if not b.unified_memory:  # a discrete GPU (the H200): cudaMemGetInfo plus the pool's spare blocks
        assert free <= b.free_memory() <= total
