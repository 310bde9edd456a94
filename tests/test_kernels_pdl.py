"""Programmatic dependent launch (kernels/pdl.py): every kernel waits for the one ahead of it before it
touches what that kernel writes, the driver structures have the C layout, and a captured chain of
dependent kernels gives the eager bits with the launches programmatic or not (on the device)."""
import ctypes
import re
from types import SimpleNamespace

import numpy as np
import pytest

import kernels
from engine.ops import cuda_available
from kernels import pdl


def kernel_bodies() -> list[tuple[str, str, str]]:
    """(file, kernel name, body) of every __global__ function in kernels/*.cu."""
    out = []
    for name in kernels.sources():
        text = (kernels.HERE / name).read_text()
        for m in re.finditer(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(", text):
            start = text.index("{", m.end())
            depth, i = 0, start
            while True:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if depth == 0:
                    break
                i += 1
            out.append((name, m.group(1), text[start:i + 1]))
    return out


def capture(stream, work, programmatic: bool):
    """The graph of work()'s launches on `stream` (current), captured with programmatic launches or not."""
    old = pdl.use_pdl(programmatic)
    try:
        stream.begin_capture()
        work()
        return stream.end_capture()
    finally:
        pdl.use_pdl(old)


def test_every_captured_kernel_waits_for_the_one_before_it():
    bodies = kernel_bodies()
    assert len(bodies) >= 30
    for file, name, body in bodies:
        if file == "timing.cu":  # the profiler's spin is never captured
            continue
        assert "PDL_ENTRY" in body, f"{file} {name}: no PDL_ENTRY"
        # a block may leave before the wait only where it has touched nothing, and says so
        for line in body[:body.index("PDL_ENTRY")].splitlines():
            if re.search(r"\breturn\b", line):
                assert "before any dependent access" in line, f"{file} {name}: leaves before PDL_ENTRY: {line}"


def test_the_kernel_bodies_are_found_whole():
    qmv = [b for f, n, b in kernel_bodies() if n == "qmv"]
    assert len(qmv) == 1 and qmv[0].startswith("{") and qmv[0].endswith("}")
    assert qmv[0].count("{") == qmv[0].count("}")


def test_driver_structures_have_the_c_layout():
    assert ctypes.sizeof(pdl.LaunchAttribute) == 72 and pdl.LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(pdl.LaunchConfig) == 56
    c = pdl.LaunchConfig
    assert (c.stream.offset, c.attrs.offset, c.nattrs.offset) == (32, 40, 48)
    attr = pdl.LaunchAttribute(pdl.PROGRAMMATIC_STREAM_SERIALIZATION, 0)
    cfg = pdl.config((7, 2), (256,), 1024, 0x1234, attr)
    assert list(cfg.grid) == [7, 2, 1] and list(cfg.block) == [256, 1, 1] and cfg.smem == 1024
    assert cfg.stream == 0x1234 and cfg.nattrs == 1 and cfg.attrs.contents.id == 6


def test_arguments_are_the_bytes_the_kernel_reads():
    assert bytes(pdl.param(np.int32(-3))) == np.int32(-3).tobytes()
    assert bytes(pdl.param(np.int64(1 << 40))) == np.int64(1 << 40).tobytes()
    assert bytes(pdl.param(np.float32(1.5))) == np.float32(1.5).tobytes()
    assert bytes(pdl.param(np.uint64(0))) == bytes(8)
    assert pdl.param(SimpleNamespace(data=SimpleNamespace(ptr=0xDEADBEEF000))).value == 0xDEADBEEF000
    with pytest.raises(TypeError, match="numpy scalar"):
        pdl.param(3)


def test_the_switch_returns_what_it_replaced():
    old = pdl.use_pdl(False)
    try:
        assert not pdl.enabled()
        assert pdl.use_pdl(True) is False
    finally:
        pdl.use_pdl(old)


def test_double_launches_repeats_the_captured_launches_it_names():
    """`bench --double`: a captured launch of a kernel the pattern names is made twice, others once,
    and None restores single launches."""
    calls = []
    kernel = lambda grid, block, args, shared_mem=0: calls.append(args)  # noqa: E731
    a = kernels._Kernel(kernel, "moe_route_slots", False)
    b = kernels._Kernel(kernel, "qmv<4, 2, 0, 2, 1, 0, 2>", False)
    old = pdl.use_pdl(False)
    try:
        kernels.double_launches("route|^qmv<8")
        a._captured((1,), (32,), ("a",), None)
        b._captured((1,), (32,), ("b",), None)
        assert calls == [("a",), ("a",), ("b",)]
        kernels.double_launches(None)
        a._captured((1,), (32,), ("a",), None)
        assert calls[3:] == [("a",)]
    finally:
        kernels.double_launches(None)
        pdl.use_pdl(old)


OK, WHY = cuda_available()


@pytest.mark.gpu
@pytest.mark.skipif(not OK, reason=WHY or "no GPU")
@pytest.mark.parametrize("n", [1, 8])
def test_a_graph_of_dependent_products_gives_the_eager_bits(n):
    """Six 512-wide products, each over the RMSNorm of the one before (the weights' first batch is
    read before the wait): a kernel that read its input before the previous one wrote it would see
    the zeros the buffers hold before the replay."""
    import cupy

    import kernels.launch as KL
    from engine.ops.cupy_backend import CupyBackend
    from engine.weights import quantize
    gb = CupyBackend()
    rng = np.random.default_rng(n)
    K = 512
    ws = [gb.prepare(quantize(rng.normal(0, K ** -0.5, (K, K)), 4, 64, np.float32)) for _ in range(6)]
    nw = cupy.asarray(rng.uniform(0.5, 1.5, K).astype(np.float32))
    x = cupy.asarray(rng.normal(0, 1, (n, K)).astype(np.float32))
    bufs = [cupy.zeros((n, K), cupy.float32) for _ in ws]

    def chain():
        cur = x
        for qw, out in zip(ws, bufs):
            KL.qmv(qw.codes, qw.sb, qw.st, 4, 64, K, K, cur, K, out, n, xm=2, nw=nw, eps=1e-5)
            cur = out

    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        chain()
        eager = [cupy.asnumpy(b) for b in bufs]
        assert np.abs(eager[-1]).sum() > 0
        for on in (True, False):
            graph = capture(s, chain, on)
            for _ in range(3):
                for b in bufs:
                    b.fill(0)
                graph.launch(s)
                s.synchronize()
                assert all(np.array_equal(cupy.asnumpy(b), e) for b, e in zip(bufs, eager)), on
