"""Sessions in this process's memory: an LRU bounded by `max_sessions`, idle ones forgotten after a TTL.

The base of every store: SQLite and Redis keep this map as their working copy and add where it is saved.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from proxy.context.calibration import Calibration
from proxy.context.journal import Journal
from proxy.state.sessions import Session, TurnStats

log = logging.getLogger("proxy.state")


class StoredTurn(Protocol):
    """What a store needs from a prepared turn (`proxy.service.engine_service.EngineTurn`) to write it."""

    session: Session
    stats: TurnStats
    journal_before: Any  # the journal the turn was prepared from
    stored_journal: Any  # the journal object the store last wrote for this turn (None: not yet)
    usage_stored: bool

    @property
    def model(self) -> str: ...

    @property
    def shared_model(self) -> str: ...  # the model name a shared store learns the ratio under ('' = none)

    @property
    def estimate(self) -> float: ...  # our uncorrected count of what was sent

    @property
    def calibration(self) -> Calibration: ...

    async def realign(self) -> None: ...  # run the turn again on `session.journal` (a newer one another process wrote)


class SessionStore:
    """Sessions by id in memory: LRU-bounded, idle ones forgotten after `idle_ttl_s`; nothing is written anywhere."""

    persistent = False
    # This process sees every request of its sessions, so `Session.idle_s` is the real idle time (a shared
    # store's copy may be behind another process's turns: its idle time is not known).
    knows_idle = True

    def __init__(
        self,
        *,
        max_sessions: int = 1000,
        idle_ttl_s: float = 6 * 3600,
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
        self._lock = threading.Lock()  # the engine may run on a worker thread (large bodies) and on the loop

    @property
    def problem(self) -> str | None:
        """Why the store is degraded (`/healthz` "state"), or None."""
        return None

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._sessions.values()))

    def get(self, session_id: str) -> Session:
        """The session, else a new one; marks it as just seen. Never waits on I/O."""
        now = self.clock()
        with self._lock:
            self._expire(now)
            session = self._sessions.pop(session_id, None)
            if session is None:
                session = Session(id=session_id, journal=self._new_journal())
            session.idle_s = now - session.last_seen if session.last_seen else 0.0
            session.last_seen = now
            self._sessions[session_id] = session
            while len(self._sessions) > self.max_sessions:
                evicted, _ = self._sessions.popitem(last=False)
                log.debug("session evicted (max_sessions): %s", evicted)
                self._forgotten(evicted)
            return session

    def peek(self, session_id: str) -> Session | None:
        """The session if known, without touching its recency (for reports)."""
        with self._lock:
            self._expire(self.clock())
            return self._sessions.get(session_id)

    def save(self, session: Session) -> None:
        """The session changed (a turn, its usage): a store that writes somewhere queues it; never blocks."""

    async def commit(self, turn: StoredTurn) -> None:
        """Make the turn's state shared before it is sent (and its usage, after): only a shared store does."""

    async def shared_rows(self, limit: int) -> list[dict[str, Any]]:
        """The `/sessions` rows of every process's sessions, when the store is shared (Redis); else none."""
        return []

    async def shared_report(self, session_id: str, limit: int) -> dict[str, Any] | None:
        """A session's `/sessions/{id}` body as a shared store holds it (any process's); None: not there."""
        return None

    def forget(self, session_id: str) -> None:
        with self._lock:
            if self._sessions.pop(session_id, None) is not None:
                self._forgotten(session_id)

    def close(self) -> None:
        """Write out what is queued (a store that writes somewhere)."""

    def _forgotten(self, session_id: str) -> None:
        """Evicted or expired (the caller holds the lock): a store that writes somewhere drops it there too."""

    def _expire(self, now: float) -> None:
        """Forget sessions idle longer than the TTL (the caller holds the lock)."""
        cutoff = now - self.idle_ttl_s
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if oldest.last_seen >= cutoff:
                break
            self._sessions.popitem(last=False)
            self._forgotten(oldest.id)
