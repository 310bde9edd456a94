"""KV memory: the page pool, lanes with page tables, windows, and the three paging modes."""
from .pool import PagePool
from .lanes import Lane, Lanes

__all__ = ["PagePool", "Lane", "Lanes"]
