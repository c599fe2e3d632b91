"""Every instance's sessions, read back from Redis: `/sessions` and `/sessions/{id}` show the whole fleet.

Each process writes, with a turn's usage, the session's `/sessions` row and its report (the
`/sessions/{id}` body without the turn details, which are the session's turns list) into the
session's hash. Which sessions exist is one sorted set, session key -> last seen, that each process
adds to in one batched call at most every `FLUSH_S` (never on a turn's path) and trims by the idle
TTL and `MAX_INDEXED`. So reading the fleet never scans the keyspace: the listing is one range of
that set and one pipelined read of the rows it names, bounded by the count asked for; one session's
report is two reads of one slot.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from proxy.state.redis_keys import INDEX_KEY, session_key, turns_key
from proxy.state.sessions import visible_id

FLUSH_S = 1.0  # the index is written at most this often per process
MAX_INDEXED = 50_000  # sessions the index keeps, the most recent (Redis memory: about 100 bytes each)
ROW_FIELD, REPORT_FIELD = "row", "report"  # fields of the session's hash


class FleetIndex:
    """The index of recent sessions every process shares, and the rows and reports it leads to."""

    def __init__(self, client: Any, idle_ttl_s: float, clock: Any = time.time) -> None:
        self.client = client
        self.idle_ttl_s = idle_ttl_s
        self.clock = clock
        self._pending: dict[str, float] = {}  # session key -> last seen, not yet in the index
        self._flushed_at = 0.0

    def seen(self, key: str, last_seen: float) -> None:
        """Note a session this process wrote, for the next batch."""
        self._pending[key] = last_seen

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def wait_s(self) -> float:
        """How long until the next batch is due."""
        return max(0.0, self._flushed_at + FLUSH_S - time.monotonic())

    async def flush(self) -> None:
        """Add the noted sessions to the index and drop the ones past their TTL, in one round trip."""
        self._flushed_at = time.monotonic()
        if not self._pending:
            return
        batch, self._pending = self._pending, {}
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(INDEX_KEY, batch, gt=True)  # a slower process never moves a session back in time
        pipe.zremrangebyscore(INDEX_KEY, "-inf", self.clock() - self.idle_ttl_s)
        pipe.zremrangebyrank(INDEX_KEY, 0, -MAX_INDEXED - 1)
        try:
            await pipe.execute()
        except BaseException:
            for key, when in batch.items():  # tried again with the next batch
                self._pending.setdefault(key, when)
            raise

    async def recent(self, limit: int) -> list[str]:
        """The keys of the `limit` most recently seen sessions, most recent first."""
        members = await self.client.zrevrange(INDEX_KEY, 0, max(0, limit - 1))
        return [m.decode() if isinstance(m, bytes) else m for m in members]

    async def rows(self, limit: int) -> list[dict[str, Any]]:
        """The `/sessions` rows of the `limit` most recent sessions, as the process that served each last wrote it."""
        keys = await self.recent(limit)
        if not keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hget(session_key(key), ROW_FIELD)
        return [orjson.loads(row) for row in await pipe.execute() if row]

    async def report(self, session_id: str, limit: int) -> dict[str, Any] | None:
        """The `/sessions/{id}` body; `session_id` is a session's key or the id a client named it by (the most
        recent such session among the `limit` most recent)."""
        found = await self._report_of(session_id)
        if found is None and "@" not in session_id:
            named = [k for k in await self.recent(limit) if visible_id(k) == session_id]
            found = await self._report_of(named[0]) if named else None
        return found

    async def _report_of(self, key: str) -> dict[str, Any] | None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(session_key(key), REPORT_FIELD)
        pipe.lrange(turns_key(key), 0, -1)
        report, turns = await pipe.execute()
        if not report:
            return None
        return {**orjson.loads(report), "turn_details": [orjson.loads(t) for t in turns]}
