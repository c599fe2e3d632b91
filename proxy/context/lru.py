"""A least-recently-used map bounded in bytes: the engine's caches of what is costly to make again (cuts,
specific tokens), each owned by its user and safe to share between threads."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class ByteLru(Generic[K, V]):
    """Values by key, each with its size in bytes; past `max_bytes` the least recently used are dropped first.
    `held` is what it holds now. A value is never None (`get` says None for a key it does not hold)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: K, value: V, size: int) -> None:
        """Keep `value` (unless another thread kept one first, or it alone is over the bound)."""
        with self._lock:
            if key in self._items or size > self.max_bytes:
                return
            self._items[key] = (value, size)
            self.held += size
            self._evict()

    def fit(self, max_bytes: int) -> None:
        """Hold at most `max_bytes` from now on (a config reload's budget), the least recently used dropped."""
        if max_bytes == self.max_bytes:  # every turn asks; the budget changes only with the config
            return
        with self._lock:
            self.max_bytes = max_bytes
            self._evict()

    def _evict(self) -> None:
        while self.held > self.max_bytes and self._items:
            self.held -= self._items.popitem(last=False)[1][1]
