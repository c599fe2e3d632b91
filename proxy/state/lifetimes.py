"""How long each agent's finished sessions lasted, and how far back they reached, kept where the sessions are
(memory, SQLite, Redis).

Per agent (`sessions.agent_fingerprint`) the lengths, in requests, of its last `MAX_PER_AGENT` finished
sessions, and each one's evidence and older-output tokens (`proxy.context.reach`: what its agent's messages used
from tool outputs, and how much of it only outputs older than the newest held), one row per session key (a
session resumed and finished again replaces its earlier row); at most
`MAX_AGENTS` agents (the least recently finished forgotten). Reads never wait on I/O: SQLite's history is read
once at start, Redis's refreshed by the service's sweep (`proxy.service.session_ends`).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import orjson

from proxy.context.reach import Reach
from proxy.state.redis_keys import PREFIX, session_key

MAX_PER_AGENT = 200  # finished sessions kept per agent: enough for a steady estimate, a few KB each
MAX_AGENTS = 1000
HISTORY_TTL_S = 30 * 86400  # Redis: an agent's history is dropped a month after its last finished session

# One finished session: its length in requests, its evidence tokens and those only older outputs held.
Row = tuple[int, int, int]


class History:
    """Finished sessions' lengths and reach per agent, in this process's memory."""

    def __init__(self, *, per_agent: int = MAX_PER_AGENT, max_agents: int = MAX_AGENTS) -> None:
        self.per_agent = max(1, per_agent)
        self.max_agents = max(1, max_agents)
        self._agents: OrderedDict[str, OrderedDict[str, Row]] = OrderedDict()  # least recently finished first
        self._lock = threading.Lock()

    def lengths(self, agent: str) -> list[int]:
        """The lengths of the agent's finished sessions, oldest first."""
        with self._lock:
            known = self._agents.get(agent)
            return [row[0] for row in known.values()] if known else []

    def reach(self, agent: str) -> Reach:
        """How far back the agent's finished sessions reached, added up."""
        with self._lock:
            rows = list((self._agents.get(agent) or {}).values())
        return Reach(sessions=len(rows), evidence=sum(r[1] for r in rows), older=sum(r[2] for r in rows))

    async def finish(self, agent: str, key: str, length: int, ended: float, reach: tuple[int, int] = (0, 0)) -> bool:
        """Session `key` of `agent` finished after `length` requests, its agent's messages having used `reach`
        (evidence, older-output tokens); False when another process's turn since says it has not (a shared store)."""
        self._remember(agent, key, (length, *reach))
        return True

    async def refresh(self, agents: Iterable[str]) -> None:
        """Read the finishes other processes recorded for these agents (a shared store)."""

    def close(self) -> None:
        """Release what the history holds open."""

    def _remember(self, agent: str, key: str, row: Row) -> None:
        with self._lock:
            known = self._agents.pop(agent, None) or OrderedDict()
            known.pop(key, None)
            known[key] = row
            while len(known) > self.per_agent:
                known.popitem(last=False)
            self._agents[agent] = known
            while len(self._agents) > self.max_agents:
                self._agents.popitem(last=False)

    def _replace(self, agent: str, rows: dict[str, Row]) -> None:
        with self._lock:
            self._agents.pop(agent, None)
            if rows:
                self._agents[agent] = OrderedDict(list(rows.items())[-self.per_agent :])


_SCHEMA = """
CREATE TABLE IF NOT EXISTS lifetimes (
    agent TEXT NOT NULL, session TEXT NOT NULL, length INTEGER NOT NULL, ended REAL NOT NULL,
    evidence INTEGER NOT NULL DEFAULT 0, older INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (agent, session)
);
"""
# A state file from before the reach columns gets them (its sessions' rows count no evidence).
_REACH_COLUMNS = ("evidence", "older")


class SqliteHistory(History):
    """`History` also written to the state file (its own table, its own connection): it survives a restart."""

    def __init__(self, path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=5)
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(lifetimes)")}
        for name in _REACH_COLUMNS:
            if name not in columns:
                self._db.execute(f"ALTER TABLE lifetimes ADD COLUMN {name} INTEGER NOT NULL DEFAULT 0")
        self._write_lock = threading.Lock()
        query = "SELECT agent, session, length, evidence, older FROM lifetimes ORDER BY ended"
        for agent, key, length, evidence, older in self._db.execute(query).fetchall():
            self._remember(str(agent), str(key), (int(length), int(evidence), int(older)))

    async def finish(self, agent: str, key: str, length: int, ended: float, reach: tuple[int, int] = (0, 0)) -> bool:
        self._remember(agent, key, (length, *reach))
        await asyncio.to_thread(self._write, agent, key, (length, *reach), ended)
        return True

    def _write(self, agent: str, key: str, row: Row, ended: float) -> None:
        length, evidence, older = row
        with self._write_lock:
            try:
                db = self._db
                db.execute("BEGIN IMMEDIATE")
                db.execute(
                    "INSERT OR REPLACE INTO lifetimes (agent, session, length, ended, evidence, older) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (agent, key, length, ended, evidence, older),
                )
                db.execute(
                    "DELETE FROM lifetimes WHERE agent = ? AND session NOT IN "
                    "(SELECT session FROM lifetimes WHERE agent = ? ORDER BY ended DESC LIMIT ?)",
                    (agent, agent, self.per_agent),
                )
                db.execute(
                    "DELETE FROM lifetimes WHERE agent NOT IN (SELECT agent FROM lifetimes GROUP BY agent "
                    "ORDER BY max(ended) DESC LIMIT ?)",
                    (self.max_agents,),
                )
                db.execute("COMMIT")
            except sqlite3.Error:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._write_lock:
            self._db.close()


# KEYS: one of the agent's hashes (session key -> "value:ended"). ARGV: session key, value, ended, cap, ttl.
# Past cap and a quarter, the oldest finishes are dropped down to cap.
_FINISH = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
local cap = tonumber(ARGV[4])
if redis.call('HLEN', KEYS[1]) > cap + math.floor(cap / 4) then
  local all = redis.call('HGETALL', KEYS[1])
  local rows = {}
  for i = 1, #all, 2 do
    local ended = tonumber(string.match(all[i + 1], ':([^:]*)$'))
    table.insert(rows, {all[i], ended})
  end
  table.sort(rows, function(a, b) return a[2] < b[2] end)
  for i = 1, #rows - cap do redis.call('HDEL', KEYS[1], rows[i][1]) end
end
return 1
"""


def history_key(agent: str) -> str:
    return f"{PREFIX}lifetimes:{agent}"


def reach_key(agent: str) -> str:
    """The agent's reach per finished session ("evidence:older:ended"): a hash of its own, beside the lengths
    ("length:ended", as an instance from before it reads them), each written by its own call (a cluster may keep
    the two in different slots)."""
    return f"{PREFIX}reach:{agent}"


class RedisHistory(History):
    """`History` shared by every instance through Redis: each agent's finishes in two hashes, lengths and reach."""

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client = client
        self._finish = client.register_script(_FINISH)

    async def finish(self, agent: str, key: str, length: int, ended: float, reach: tuple[int, int] = (0, 0)) -> bool:
        row = await self.client.hget(session_key(key), "row")  # another instance's turn since: still running
        if row and float(orjson.loads(row).get("last_seen") or 0) > ended + 1e-3:
            return False
        cap = [repr(ended), self.per_agent, HISTORY_TTL_S]
        await self._finish(keys=[history_key(agent)], args=[key, length, *cap])
        await self._finish(keys=[reach_key(agent)], args=[key, f"{reach[0]}:{reach[1]}", *cap])
        self._remember(agent, key, (length, *reach))
        return True

    async def refresh(self, agents: Iterable[str]) -> None:
        names = list(dict.fromkeys(agents))
        if not names:
            return
        pipe = self.client.pipeline(transaction=False)
        for agent in names:
            pipe.hgetall(history_key(agent))
            pipe.hgetall(reach_key(agent))
        found = await pipe.execute()
        for agent, lengths, reached in zip(names, found[::2], found[1::2], strict=True):
            reach = {_text(key): _text(value).split(":") for key, value in (reached or {}).items()}
            rows = []
            for key, value in (lengths or {}).items():
                length, _, ended = _text(value).partition(":")
                evidence, older, *_ = reach.get(_text(key), ["0", "0"])
                rows.append((float(ended or 0), _text(key), (int(length), int(evidence or 0), int(older or 0))))
            self._replace(agent, {key: row for _, key, row in sorted(rows)})


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
