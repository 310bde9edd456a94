"""Compute backends: one op set (`base.Backend`), a numpy reference and a CuPy GPU implementation.

`get_backend(name)` returns a `base.Backend`; the models, the cache and the scheduler call only its
members, so they run unchanged on either.
"""
from __future__ import annotations

from ..errors import BackendError
from .base import Backend


def cuda_available() -> tuple[bool, str]:
    """Whether CuPy imports and finds a device, and a reason when it does not."""
    try:
        import cupy  # noqa: F401  (optional dependency)
    except Exception as e:  # ImportError, or a broken CUDA install raising at import
        return False, f"CuPy is not usable ({type(e).__name__}: {e})".splitlines()[0]
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return False, f"no CUDA device ({e})".splitlines()[0]
    return (n > 0, "" if n > 0 else "no CUDA device")


def get_backend(name: str = "auto", log=print) -> Backend:
    """`auto` picks cupy where a device is present, else numpy with one line saying so."""
    if name not in ("auto", "numpy", "cupy"):
        raise BackendError(f"unknown backend {name!r} (numpy, cupy or auto)")
    if name in ("auto", "cupy"):
        ok, why = cuda_available()
        if ok:
            from .cupy_backend import CupyBackend
            return CupyBackend()
        if name == "cupy":
            raise BackendError(f"--backend cupy: {why}")
        log(f"backend: auto falls back to numpy on the CPU: {why}")
    from .numpy_backend import NumpyBackend
    return NumpyBackend()
