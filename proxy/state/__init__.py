"""Where sessions live: this process's memory, one SQLite file behind it, or a Redis server shared by many.

Every store keeps the recent sessions in memory (`SessionStore`: LRU + idle TTL) and the
engine works on that copy; the event loop never waits on a disk or a network for it.
`store_from_config` picks the store the `[state]` section names.
"""

from __future__ import annotations

from typing import Any

from proxy.config.loader import ConfigError
from proxy.config.settings import StateConfig
from proxy.state.memory import SessionStore, StoredTurn
from proxy.state.sqlite import SqliteStore

__all__ = ["SessionStore", "SqliteStore", "StoredTurn", "store_from_config"]


def store_from_config(config: StateConfig, **kwargs: Any) -> SessionStore:
    """Redis when `redis_url` is set, else SQLite when `path` is, else memory only."""
    if config.redis_url and config.path:
        raise ConfigError("[state] redis_url and path are two stores: set one of them")
    if config.redis_url:
        from proxy.state.redis import RedisStore  # redis-py is imported only by those who use it

        return RedisStore.from_config(config, **kwargs)
    bounds = {
        "max_sessions": config.max_sessions,
        "max_bytes": config.memory_bytes,
        "max_session_bytes": config.max_session_bytes,
        "idle_ttl_s": config.idle_ttl_s,
        **kwargs,
    }
    if config.path:
        return SqliteStore(path=config.path, **bounds)
    return SessionStore(**bounds)
