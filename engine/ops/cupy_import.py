"""CuPy for the GPU backend's modules, imported in this one place. Only attempted once get_backend has
chosen the CuPy backend, so a failure here is one it has reported first."""
from ..errors import BackendError

try:
    import cupy
    import cupyx
except Exception as e:  # pragma: no cover - get_backend reports why first
    raise BackendError(f"CuPy is not usable ({type(e).__name__}: {e})") from None

__all__ = ["cupy", "cupyx"]
