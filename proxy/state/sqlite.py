"""Sessions in memory, written behind to one SQLite file so journals survive a restart.

The file is opened, checked writable and read at start-up (the most recent `max_sessions`
sessions); after that the event loop never touches it. Each change queues the session for
one writer thread, which writes the newest state of every queued session in one
transaction. A locked or failing file never delays a turn: the writer keeps the queue and
retries with backoff, `/healthz` says why the state is degraded, and no queued session is
lost once the file is writable again. The file keeps the `max_sessions` most recent sessions,
more than memory may hold (`memory_mb`): a session evicted from memory for room keeps its row and
is read back, off the loop, when its next turn comes (`restore`). A session bigger than
`max_session_kb` is kept nowhere, so the file stays under about max_sessions x max_session_kb.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

from proxy.config.loader import ConfigError
from proxy.metrics import METRICS
from proxy.state.codec import FIELDS, journal_bytes, session_from, totals_bytes, turns_bytes
from proxy.state.conversations import session_key
from proxy.state.lifetimes import SqliteHistory
from proxy.state.memory import SessionStore
from proxy.state.sessions import Session

log = logging.getLogger("proxy.state")

STATE_FAILURES = METRICS.counter(
    "context_proxy_state_failures_total", "Session store writes or reads that failed (the turn went on)", ("store",)
)
STATE_TOO_LARGE = METRICS.counter(
    "context_proxy_state_too_large_total", "Sessions past state.max_session_kb, not stored", ("store",)
)
RESTORED = METRICS.counter(
    "context_proxy_sessions_restored_total", "Sessions evicted from memory for room, read back from the state file"
)

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
    turns BLOB NOT NULL,
    totals BLOB NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS sessions_last_seen ON sessions (last_seen);
CREATE TABLE IF NOT EXISTS proxy_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_BUSY_TIMEOUT_MS = 200  # a locked file fails a write this fast; the writer retries it later
_RETRY_S = (0.05, 2.0)  # first and longest wait between retries of a failed write
_DELETE = None  # queued in place of a session: delete its row


class SqliteStore(SessionStore):
    """`SessionStore` whose sessions are also written, behind the turns, to one SQLite file."""

    persistent = True

    def __init__(self, *, path: str | Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.path = str(path)
        self._queue: dict[str, Session | None] = {}
        self._batch: dict[str, Session | None] = {}  # being written: pending until the write returns
        # Sessions evicted from memory whose newest state is in the file (or queued for it), by the key of the
        # session they belong to (a conversation's key: its session's), oldest first; at most max_sessions.
        self._restorable: dict[str, set[str]] = {}
        self._reader: sqlite3.Connection | None = None  # restores read on their own connection
        self._reading = threading.Lock()
        self._wake = threading.Condition()
        self._closed = False
        self._problem: str | None = None
        self._db, self._ready = _open(self.path)
        if not self._ready:
            self._failed(f"state file {self.path} is locked by another process; its writes are queued")
        self._preload()
        if self._ready:
            self.history = SqliteHistory(self.path)
        self._writer = threading.Thread(target=self._write_loop, name="state-writer", daemon=True)
        self._writer.start()

    @property
    def problem(self) -> str | None:
        return self._problem

    @property
    def pending(self) -> int:
        """Sessions queued or being written, not yet known to be written."""
        with self._wake:
            return len(self._queue) + len(self._batch)

    def save(self, session: Session) -> bool:
        held = super().save(session)
        if held or session.id in self._restorable.get(session_key(session.id), ()):  # evicted mid-turn: written
            self._enqueue(session.id, session)
        return held

    async def restore(self, session_id: str) -> None:
        with self._lock:
            keys = self._restorable.pop(session_id, None)
        if not keys:
            return
        with self._wake:  # a state not yet written is the newest one
            pending = {key: self._queue.get(key) or self._batch.get(key) for key in keys}
        found = {key: session for key, session in pending.items() if session is not None}
        unread = [key for key in keys if key not in found]
        if unread:
            found.update(await asyncio.to_thread(self._read, unread))
        with self._lock:
            for key, session in found.items():
                if key not in self._sessions:
                    self._sessions[key] = session
                    self._hold(session)
            self._fit()
        RESTORED.inc(len(found))

    def _read(self, keys: list[str]) -> dict[str, Session]:
        """The stored sessions of `keys` (on a worker thread: never the loop)."""
        marks = ",".join("?" * len(keys))
        try:
            with self._reading:
                if self._reader is None:
                    self._reader = sqlite3.connect(self.path, check_same_thread=False, timeout=_BUSY_TIMEOUT_MS / 1000)
                rows = self._reader.execute(f"SELECT * FROM sessions WHERE id IN ({marks})", keys).fetchall()
        except sqlite3.Error as exc:
            STATE_FAILURES.inc(store="sqlite")
            log.error("state file %s: an evicted session could not be read back (%s); it starts afresh", self.path, exc)
            return {}
        return {session.id: session for session in map(self._decoded, rows) if session is not None}

    def _decoded(self, row: tuple) -> Session | None:
        try:
            fields = dict(zip(FIELDS, row[1:8], strict=True))
            return session_from(row[0], fields, row[8], row[9], self._journal_from_dict, totals=row[10])
        except (ValueError, TypeError, KeyError) as exc:
            log.error("session state unreadable, starting it afresh: %s", exc)
            return None

    def close(self) -> None:
        """Write what is queued (one last try) and close the file."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._writer.join(timeout=5)
        if self._reader is not None:
            self._reader.close()
        self.history.close()

    def _forgotten(self, session_id: str) -> None:
        self._enqueue(session_id, _DELETE)
        keys = self._restorable.get(session_key(session_id))
        if keys is not None:
            keys.discard(session_id)

    def _evicted(self, session_id: str) -> None:
        owner = session_key(session_id)
        self._restorable.setdefault(owner, set()).add(session_id)
        while len(self._restorable) > self.max_sessions:  # the file keeps no more than these
            del self._restorable[next(iter(self._restorable))]

    def _enqueue(self, session_id: str, session: Session | None) -> None:
        with self._wake:
            self._queue[session_id] = session
            self._wake.notify()

    def _preload(self) -> None:
        """The most recent `max_sessions` sessions that have not expired, as many as fit the memory budget (the
        others are read back when their turn comes); the loop reads nothing else from the file."""
        cutoff = self.clock() - self.idle_ttl_s
        loaded: list[Session] = []
        try:
            rows = self._db.execute(
                "SELECT * FROM sessions WHERE last_seen >= ? ORDER BY last_seen DESC LIMIT ?",
                (cutoff, self.max_sessions),
            )
            for row in rows:
                if self.held > self.max_bytes:
                    self._evicted(row[0])
                elif (session := self._decoded(row)) is not None:
                    self._hold(session)
                    loaded.append(session)
        except sqlite3.Error as exc:
            self._failed(f"state file {self.path} unreadable at start ({exc}); starting without its sessions")
        for session in reversed(loaded):  # least recent first, as the LRU keeps them
            self._sessions[session.id] = session
        self._restorable = dict(reversed(self._restorable.items()))  # oldest first
        self._fit()

    def _write_loop(self) -> None:
        delay = _RETRY_S[0]
        while True:
            with self._wake:
                while not self._queue and not self._closed:
                    self._wake.wait()
                closing = self._closed
                batch = self._batch = self._queue
                self._queue = {}
            try:
                if batch:
                    self._write(batch)
            except sqlite3.Error as exc:
                with self._wake:  # keep what failed unless a newer state was queued meanwhile
                    self._queue = {**batch, **self._queue}
                    self._batch = {}
                    self._failed(f"state file {self.path} not writable ({exc}); {len(self._queue)} sessions queued")
                    if not closing:
                        self._wake.wait(timeout=delay)
                delay = min(_RETRY_S[1], delay * 2)
            else:
                if self._problem is not None:
                    log.warning("state file %s is writable again; the queued sessions are written", self.path)
                with self._wake:
                    self._problem, self._batch, delay = None, {}, _RETRY_S[0]
            if closing:
                self._db.close()
                return

    def _write(self, batch: dict[str, Session | None]) -> None:
        rows, deletes = [], []
        for key, session in batch.items():
            row = None if session is None else self._row(session)
            if row is None:
                deletes.append((key,))
            else:
                rows.append(row)
        db = self._db
        if not self._ready:  # the file was locked at start-up
            _create(db)
            self._ready = True
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("DELETE FROM sessions WHERE id = ?", deletes)
            db.executemany("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            db.execute(
                "DELETE FROM sessions WHERE id NOT IN (SELECT id FROM sessions ORDER BY last_seen DESC LIMIT ?)",
                (self.max_sessions,),
            )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _row(self, session: Session) -> tuple | None:
        journal, turns = journal_bytes(session), turns_bytes(session)
        if len(journal) + len(turns) > self.max_session_bytes:
            STATE_TOO_LARGE.inc(store="sqlite")
            log.warning("session %s is over state.max_session_kb; not stored", session.id)
            return None
        return (session.id, *(getattr(session, name) for name in FIELDS), journal, turns, totals_bytes(session))

    def _failed(self, reason: str) -> None:
        if self._problem is None:
            log.error("%s", reason)
        self._problem = reason
        STATE_FAILURES.inc(store="sqlite")


def _create(db: sqlite3.Connection) -> None:
    """The tables, and the column a file written before the session totals lacks (its sessions' totals start at 0)."""
    db.executescript(_SCHEMA)
    if "totals" not in {column[1] for column in db.execute("PRAGMA table_info(sessions)")}:
        db.execute("ALTER TABLE sessions ADD COLUMN totals BLOB NOT NULL DEFAULT '{}'")


def _open(path: str) -> tuple[sqlite3.Connection, bool]:
    """The state file, checked writable now: a file that cannot be written is a start-up error.

    A file another process holds locked is not: the proxy starts degraded and the writer retries.
    """
    db = None
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=_BUSY_TIMEOUT_MS / 1000)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        _create(db)
        db.execute("INSERT OR REPLACE INTO proxy_meta VALUES ('opened', datetime('now'))")
    except sqlite3.OperationalError as exc:
        if db is not None and ("locked" in str(exc) or "busy" in str(exc)):
            return db, False
        raise ConfigError(f"[state] path {path}: cannot write the session store there: {exc}") from exc
    except (OSError, sqlite3.Error) as exc:
        raise ConfigError(f"[state] path {path}: cannot use it as the session store: {exc}") from exc
    return db, True
