"""Where sessions live: a bounded in-memory map, optionally backed by one SQLite file.

Memory is bounded by `max_sessions` (the least recently seen session goes first) and by
an idle TTL. With a `path`, each session is one row (journal and turn stats as JSON),
read on first access and rewritten after each turn, so journals survive a restart and a
session evicted from memory comes back as it was.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from proxy.config import ConfigError, StateConfig
from proxy.context.journal import Journal
from proxy.sessions import Session, TurnStats

log = logging.getLogger("proxy.state")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    policy TEXT NOT NULL,
    last_seen REAL NOT NULL,
    correction REAL NOT NULL,
    direct_prompt_tokens INTEGER NOT NULL,
    turn_count INTEGER NOT NULL,
    cost_usd REAL NOT NULL,
    direct_cost_usd REAL NOT NULL,
    journal BLOB NOT NULL,
    turns BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_last_seen ON sessions (last_seen);
"""
# How often expired rows are deleted from the file (seconds of the store's clock).
_PURGE_EVERY_S = 60.0


class SessionStore:
    """Sessions by id: LRU-bounded, idle ones forgotten after `idle_ttl_s`, optionally persisted."""

    def __init__(
        self,
        *,
        max_sessions: int = 1000,
        idle_ttl_s: float = 6 * 3600,
        path: str | Path = "",
        clock: Callable[[], float] = time.time,
        new_journal: Callable[[], Any] = Journal,
        journal_from_dict: Callable[[dict[str, Any]], Any] = Journal.from_dict,
    ) -> None:
        self.max_sessions = max(1, max_sessions)
        self.idle_ttl_s = idle_ttl_s
        self.clock = clock
        self._new_journal = new_journal
        self._journal_from_dict = journal_from_dict
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently seen first
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if path:
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.executescript(_SCHEMA)
            except (OSError, sqlite3.Error) as exc:
                raise ConfigError(f"[state] path {path}: cannot use it as the session store: {exc}") from exc
        self._purged_at = float("-inf")

    @classmethod
    def from_config(cls, config: StateConfig, **kwargs: Any) -> SessionStore:
        return cls(max_sessions=config.max_sessions, idle_ttl_s=config.idle_ttl_s, path=config.path, **kwargs)

    @property
    def persistent(self) -> bool:
        return self._db is not None

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._sessions.values()))

    def get(self, session_id: str) -> Session:
        """The session, from memory, else from the file, else new; marks it as just seen."""
        now = self.clock()
        with self._lock:
            self._expire(now)
            session = self._sessions.pop(session_id, None)
            if session is None:
                session = self._load(session_id, now) or Session(id=session_id, journal=self._new_journal())
            session.last_seen = now
            self._sessions[session_id] = session
            while len(self._sessions) > self.max_sessions:
                evicted, _ = self._sessions.popitem(last=False)
                log.debug("session evicted from memory (max_sessions): %s", evicted)
            return session

    def peek(self, session_id: str) -> Session | None:
        """The session if known, without touching its recency (for reports)."""
        with self._lock:
            self._expire(self.clock())
            session = self._sessions.get(session_id)
            return session if session is not None else self._load(session_id, None)

    def save(self, session: Session) -> None:
        """Write the session's row; a no-op without a file. A failed write is logged, never raised."""
        if self._db is None:
            return
        row = (
            session.id,
            session.policy,
            session.last_seen,
            session.correction,
            session.direct_prompt_tokens,
            session.turn_count,
            session.cost_usd,
            session.direct_cost_usd,
            orjson.dumps(session.journal.to_dict()),
            orjson.dumps([t.to_dict() for t in session.turns]),
        )
        try:
            with self._lock:
                self._db.execute("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
        except sqlite3.Error as exc:
            log.error("session state not saved: %s", exc)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)
            if self._db is not None:
                self._db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _expire(self, now: float) -> None:
        """Forget sessions idle longer than the TTL, in memory and on disk (caller holds the lock)."""
        cutoff = now - self.idle_ttl_s
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if oldest.last_seen >= cutoff:
                break
            self._sessions.popitem(last=False)
        if self._db is not None and now - self._purged_at >= _PURGE_EVERY_S:
            self._purged_at = now
            self._db.execute("DELETE FROM sessions WHERE last_seen < ?", (cutoff,))

    def _load(self, session_id: str, now: float | None) -> Session | None:
        if self._db is None:
            return None
        try:
            row = self._db.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                return None
            _, policy, last_seen, correction, direct, turn_count, cost, direct_cost, journal, turns = row
            return Session(
                id=session_id,
                journal=self._journal_from_dict(orjson.loads(journal)),
                policy=policy,
                turns=[TurnStats.from_dict(t) for t in orjson.loads(turns)],
                turn_count=turn_count,
                last_seen=last_seen if now is None else now,
                correction=correction,
                direct_prompt_tokens=direct,
                cost_usd=cost,
                direct_cost_usd=direct_cost,
            )
        except (sqlite3.Error, orjson.JSONDecodeError, TypeError, ValueError, KeyError) as exc:
            log.error("session state unreadable, starting afresh: %s", exc)
            return None
