"""Sessions in this process's memory: an LRU bounded in bytes and by `max_sessions`, idle ones forgotten after a TTL.

The base of every store: SQLite and Redis keep this map as their working copy and add where it is saved.
Each session's size is counted when it changes (`Session.approx_bytes`: sums of lengths, never a walk), so the
sessions together (with what `also_held` names: the body memos, the cut contents) stay within `max_bytes`, the
least recently used evicted first; a session past `max_session_bytes` is not kept after its turn. An evicted
session comes back from a store that keeps it (SQLite, Redis); from memory alone it starts afresh.
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
from proxy.metrics import METRICS
from proxy.state.lifetimes import History
from proxy.state.sessions import Session, TurnStats

log = logging.getLogger("proxy.state")

MB = 1024 * 1024
HELD = METRICS.gauge("context_proxy_memory_bytes", "Bytes held in memory (estimated), by what holds them", ("part",))
_HELD_SESSIONS = HELD.labels(part="sessions")  # set on every save
BUDGET = METRICS.gauge(
    "context_proxy_memory_budget_bytes", "[state] memory_mb: what sessions, body memos and cut contents may hold"
)
EVICTED = METRICS.counter(
    "context_proxy_sessions_evicted_total",
    "Sessions dropped from memory: least recently used past memory_mb or max_sessions, or one past max_session_kb",
    ("reason",),
)


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
    commits = False  # `commit` writes nothing (a shared store's does)

    def __init__(
        self,
        *,
        max_sessions: int = 1000,
        max_bytes: int = 512 * MB,
        max_session_bytes: int = 8 * MB,
        idle_ttl_s: float = 6 * 3600,
        clock: Callable[[], float] = time.time,
        new_journal: Callable[[], Any] = Journal,
        journal_from_dict: Callable[[dict[str, Any]], Any] = Journal.from_dict,
    ) -> None:
        self.max_sessions = max(1, max_sessions)
        self.max_bytes = max_bytes
        self.max_session_bytes = max_session_bytes
        self.held = 0  # the sessions' `held_bytes`, summed
        self.also_held: Callable[[], int] = lambda: 0  # what else counts against `max_bytes` (the body memos)
        BUDGET.set(max_bytes)
        self.idle_ttl_s = idle_ttl_s
        self.clock = clock
        self._new_journal = new_journal
        self._journal_from_dict = journal_from_dict
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently seen first
        self._lock = threading.Lock()  # the engine may run on a worker thread (large bodies) and on the loop
        self.history = History()  # how long each agent's finished sessions lasted (`proxy.state.lifetimes`)

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
                self._hold(session)
            session.idle_s = now - session.last_seen if session.last_seen else 0.0
            session.last_seen = now
            self._sessions[session_id] = session
            self._fit()
            return session

    def peek(self, session_id: str) -> Session | None:
        """The session if known, without touching its recency (for reports)."""
        with self._lock:
            self._expire(self.clock())
            return self._sessions.get(session_id)

    def save(self, session: Session) -> bool:
        """The session changed (a turn, its usage): its size counted again, the least recently used sessions
        evicted past the budget (a store that writes somewhere queues it too; never blocks). False: the
        session is no longer held here (evicted while its turn went on, or past `max_session_bytes`)."""
        with self._lock:
            if self._sessions.get(session.id) is not session:
                return False
            self.held -= session.held_bytes
            self._hold(session)
            if session.held_bytes > self.max_session_bytes:
                self._drop(session.id)
                EVICTED.inc(reason="too_large")
                log.warning("session %s is over state.max_session_kb; it starts afresh next turn", session.id)
                self._forgotten(session.id)
                self._publish()
                return False
            self._sessions.move_to_end(session.id)
            self._fit()
            return True

    async def restore(self, session_id: str) -> None:
        """Bring back session `session_id` and its conversations if they were evicted and a store keeps them
        (SQLite); read off the loop. Called holding the session's gate, before its turn."""

    async def commit(self, turn: StoredTurn) -> None:
        """Make the turn's state shared before it is sent (and its usage, after): only a shared store does
        (and says so by `commits`, so the shell skips a call that does nothing)."""

    def chain(self, link: str, key: str) -> None:
        """A response (`link`: its id hashed with the credential) was answered in session `key`: a shared store
        writes it on the turn's `commit`, so the next link lands there on any process."""

    async def chained(self, link: str) -> str | None:
        """The session a shared store says the response `link` was answered in; None: not shared, or unknown."""
        return None

    async def shared_rows(self, limit: int) -> list[dict[str, Any]]:
        """The `/sessions` rows of every process's sessions, when the store is shared (Redis); else none."""
        return []

    async def shared_report(self, session_id: str, limit: int) -> dict[str, Any] | None:
        """A session's `/sessions/{id}` body as a shared store holds it (any process's); None: not there."""
        return None

    def forget(self, session_id: str) -> None:
        with self._lock:
            if self._drop(session_id) is not None:
                self._forgotten(session_id)
                self._publish()

    def close(self) -> None:
        """Write out what is queued (a store that writes somewhere)."""

    def _forgotten(self, session_id: str) -> None:
        """Expired, forgotten or too large (the caller holds the lock): a store that writes somewhere drops it too."""

    def _evicted(self, session_id: str) -> None:
        """Evicted for room (the caller holds the lock): a store that keeps it (SQLite, Redis) can bring it back."""

    def _hold(self, session: Session) -> None:
        """Count the session's size as it is now (the caller holds the lock; the session is, or will be, held)."""
        session.held_bytes = session.approx_bytes()
        self.held += session.held_bytes

    def _drop(self, session_id: str) -> Session | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self.held -= session.held_bytes
        return session

    def _fit(self) -> None:
        """Evict the least recently used sessions until the rest fit `max_sessions` and the byte budget; the most
        recent one stays (the caller holds the lock and has just touched it)."""
        budget = self.max_bytes - self.also_held()
        while len(self._sessions) > 1 and (self.held > budget or len(self._sessions) > self.max_sessions):
            oldest = next(iter(self._sessions))
            reason = "memory" if self.held > budget else "max_sessions"
            self._drop(oldest)
            EVICTED.inc(reason=reason)
            log.debug("session evicted (%s): %s", reason, oldest)
            self._evicted(oldest)
        self._publish()

    def _publish(self) -> None:
        _HELD_SESSIONS.set(self.held)

    def _expire(self, now: float) -> None:
        """Forget sessions idle longer than the TTL (the caller holds the lock)."""
        cutoff = now - self.idle_ttl_s
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if oldest.last_seen >= cutoff:
                break
            self._drop(oldest.id)
            self._forgotten(oldest.id)
