"""Stream state: the page pool, lanes with page tables and windows, and the cache that holds it all."""
from .cache import Cache, LaneState
from .lanes import Lane, Lanes
from .pool import PagePool

__all__ = ["Cache", "LaneState", "PagePool", "Lane", "Lanes"]
