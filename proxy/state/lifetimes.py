"""How long each agent's finished sessions lasted, kept where the sessions are (memory, SQLite, Redis).

Per agent (`sessions.agent_fingerprint`) the lengths, in requests, of its last `MAX_PER_AGENT` finished
sessions, one per session key (a session resumed and finished again replaces its earlier length); at most
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

from proxy.state.redis_keys import PREFIX, session_key

MAX_PER_AGENT = 200  # finished sessions kept per agent: enough for a steady estimate, a few KB each
MAX_AGENTS = 1000
HISTORY_TTL_S = 30 * 86400  # Redis: an agent's history is dropped a month after its last finished session


class History:
    """Finished sessions' lengths per agent, in this process's memory."""

    def __init__(self, *, per_agent: int = MAX_PER_AGENT, max_agents: int = MAX_AGENTS) -> None:
        self.per_agent = max(1, per_agent)
        self.max_agents = max(1, max_agents)
        self._agents: OrderedDict[str, OrderedDict[str, int]] = OrderedDict()  # least recently finished first
        self._lock = threading.Lock()

    def lengths(self, agent: str) -> list[int]:
        """The lengths of the agent's finished sessions, oldest first."""
        with self._lock:
            known = self._agents.get(agent)
            return list(known.values()) if known else []

    async def finish(self, agent: str, key: str, length: int, ended: float) -> bool:
        """Session `key` of `agent` finished after `length` requests; False when another process's turn since
        says it has not (a shared store)."""
        self._remember(agent, key, length)
        return True

    async def refresh(self, agents: Iterable[str]) -> None:
        """Read the finishes other processes recorded for these agents (a shared store)."""

    def close(self) -> None:
        """Release what the history holds open."""

    def _remember(self, agent: str, key: str, length: int) -> None:
        with self._lock:
            known = self._agents.pop(agent, None) or OrderedDict()
            known.pop(key, None)
            known[key] = length
            while len(known) > self.per_agent:
                known.popitem(last=False)
            self._agents[agent] = known
            while len(self._agents) > self.max_agents:
                self._agents.popitem(last=False)

    def _replace(self, agent: str, lengths: dict[str, int]) -> None:
        with self._lock:
            self._agents.pop(agent, None)
            if lengths:
                self._agents[agent] = OrderedDict(list(lengths.items())[-self.per_agent :])


_SCHEMA = """
CREATE TABLE IF NOT EXISTS lifetimes (
    agent TEXT NOT NULL, session TEXT NOT NULL, length INTEGER NOT NULL, ended REAL NOT NULL,
    PRIMARY KEY (agent, session)
);
"""


class SqliteHistory(History):
    """`History` also written to the state file (its own table, its own connection): it survives a restart."""

    def __init__(self, path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=5)
        self._db.executescript(_SCHEMA)
        self._write_lock = threading.Lock()
        rows = self._db.execute("SELECT agent, session, length FROM lifetimes ORDER BY ended").fetchall()
        for agent, key, length in rows:
            self._remember(str(agent), str(key), int(length))

    async def finish(self, agent: str, key: str, length: int, ended: float) -> bool:
        self._remember(agent, key, length)
        await asyncio.to_thread(self._write, agent, key, length, ended)
        return True

    def _write(self, agent: str, key: str, length: int, ended: float) -> None:
        with self._write_lock:
            try:
                db = self._db
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT OR REPLACE INTO lifetimes VALUES (?, ?, ?, ?)", (agent, key, length, ended))
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


# KEYS: the agent's hash (session key -> "length:ended"). ARGV: session key, length, ended, cap, ttl.
# Past cap and a quarter, the oldest finishes are dropped down to cap.
_FINISH = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
local cap = tonumber(ARGV[4])
if redis.call('HLEN', KEYS[1]) > cap + math.floor(cap / 4) then
  local all = redis.call('HGETALL', KEYS[1])
  local rows = {}
  for i = 1, #all, 2 do
    local ended = tonumber(string.match(all[i + 1], ':(.*)$'))
    table.insert(rows, {all[i], ended})
  end
  table.sort(rows, function(a, b) return a[2] < b[2] end)
  for i = 1, #rows - cap do redis.call('HDEL', KEYS[1], rows[i][1]) end
end
return 1
"""


def history_key(agent: str) -> str:
    return f"{PREFIX}lifetimes:{agent}"


class RedisHistory(History):
    """`History` shared by every instance through Redis: each agent's finishes in one hash."""

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client = client
        self._finish = client.register_script(_FINISH)

    async def finish(self, agent: str, key: str, length: int, ended: float) -> bool:
        row = await self.client.hget(session_key(key), "row")  # another instance's turn since: still running
        if row and float(orjson.loads(row).get("last_seen") or 0) > ended + 1e-3:
            return False
        await self._finish(keys=[history_key(agent)], args=[key, length, repr(ended), self.per_agent, HISTORY_TTL_S])
        self._remember(agent, key, length)
        return True

    async def refresh(self, agents: Iterable[str]) -> None:
        names = list(dict.fromkeys(agents))
        if not names:
            return
        pipe = self.client.pipeline(transaction=False)
        for agent in names:
            pipe.hgetall(history_key(agent))
        for agent, found in zip(names, await pipe.execute(), strict=True):
            rows = []
            for key, value in (found or {}).items():
                length, _, ended = _text(value).partition(":")
                rows.append((float(ended or 0), _text(key), int(length)))
            self._replace(agent, {key: length for _, key, length in sorted(rows)})


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
