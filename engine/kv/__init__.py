"""Stream state: the page pool, lanes with page tables and windows, the cache that holds it all,
and snapshots of one stream (host memory and files)."""
from .cache import Cache, LaneState
from .lanes import Lane, Lanes
from .pool import PagePool
from .snapshots import Snapshot, SnapshotError

__all__ = ["Cache", "LaneState", "PagePool", "Lane", "Lanes", "Snapshot", "SnapshotError"]
