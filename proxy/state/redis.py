"""Sessions shared through a Redis server, so any number of instances and workers serve one conversation.

Each process keeps its recent sessions in memory (the LRU of `SessionStore`) and Redis holds
the truth. A turn is prepared on the local copy, then `commit()` writes it with one Lua call
that compares and sets: it succeeds only if the session's version is the one the turn was
prepared from. Otherwise the same call returns the newer state, the turn is re-run on it (the
loser re-aligns), and written again. So a session served by one process costs one round trip
per turn, one that moves between processes two (and a second engine run); its usage follows in
one scripted write after the answer. The model's learned ratio (calibration) is learned inside
Redis and comes back with every commit, so every process counts with the shared ratio.

Redis slow or down never stalls a turn: each call is bounded by `redis_timeout_ms`, a
failure is counted, `/healthz` says "degraded", and for `redis_retry_s` turns go on from
this process's own copy (edited as usual) without calling Redis. The next call after that
tries again; when it succeeds the state is shared again (a process whose copy is behind
re-aligns on its next turn). Keys expire with the idle TTL; a session's stored journal is
bounded by `max_session_kb` (a larger one is dropped from Redis, and from memory after its turn),
its turn details by `MAX_TURNS_KEPT`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Awaitable
from typing import Any
from urllib.parse import urlsplit

import orjson
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from proxy.config.settings import StateConfig
from proxy.context.calibration import RATIO_SMOOTHING, observed_ratio
from proxy.metrics import METRICS
from proxy.state.chain_links import ChainLinks
from proxy.state.codec import TOTALS, journal_bytes, session_from
from proxy.state.fleet import REPORT_FIELD, ROW_FIELD, FleetIndex
from proxy.state.lifetimes import RedisHistory
from proxy.state.memory import SessionStore, StoredTurn
from proxy.state.redis_keys import CALIBRATION_KEY, session_key, turns_key
from proxy.state.sessions import MAX_TURNS_KEPT, Session
from proxy.state.sqlite import STATE_FAILURES, STATE_TOO_LARGE

log = logging.getLogger("proxy.state")

STATE_CONFLICTS = METRICS.counter(
    "context_proxy_state_conflicts_total", "Turns re-run because another process wrote their session first"
)

# Model names come from clients: the shared hash learns only names a [models] entry other than "*" lists
# (an unlisted one is learned in this process's memory, bounded there), at most this many, and it expires
# when no turn taught it anything for the idle TTL.
MAX_MODELS_SHARED = 256
# Journals this long are encoded on a worker thread, not on the loop.
_OFFLOAD_MESSAGES = 1000
_MAX_REALIGNS = 3  # a turn that loses this many races in a row goes out as last prepared
_READ_TIMEOUT_S = 1.0  # reading the fleet's sessions (not on a turn's path) may take this long

# The session's totals (proxy.state.codec.TOTALS) as a Lua table of the hash fields that count them.
_TOTALS_LUA = "{" + ", ".join(f"'{name}'" for name in TOTALS) + "}"

# KEYS: session hash, calibration hash (not on a cluster: another slot). ARGV: expected version, state,
# ttl ms, model, new version. The state is written only if nobody wrote since the turn was prepared (or
# Redis lost the key). Versions are random, never counted, so two processes that each went on alone never
# match by chance. Either way the model's shared learned ratio comes back, for this process's next turns;
# a refusal brings the newer state, its costs and its totals.
_COMMIT = (
    """
local v = redis.call('HGET', KEYS[1], 'v')
local r = ''
if KEYS[2] then r = redis.call('HGET', KEYS[2], ARGV[4]) or '' end
if not v or v == ARGV[1] then
  redis.call('HSET', KEYS[1], 'v', ARGV[5], 's', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, ARGV[5], r}
end
local h = redis.call('HMGET', KEYS[1], 'v', 's', 'cost', 'direct_cost', 'direct_prompt', unpack("""
    + _TOTALS_LUA
    + """))
local reply = {0, h[1] or '', h[2] or '', r}
for i = 3, #h do reply[#reply + 1] = h[i] or '0' end
return reply
"""
)

# KEYS: calibration hash. ARGV: model ('' = not shared), observed ratio ('' = none), smoothing, the most
# models the hash holds (a new one past it is not learned there), ttl ms. Calibration.learn done where
# every process sees it, so two turns that learn at once both count (%.17g gives Python the same float
# back). Returns the model's shared ratio. Part of _USAGE, or on a cluster a call of its own.
_LEARN = """
if ARGV[{m}] == '' then return '' end
local known = redis.call('HGET', KEYS[{k}], ARGV[{m}])
if ARGV[{o}] == '' or (not known and redis.call('HLEN', KEYS[{k}]) >= tonumber(ARGV[{c}])) then
  return known or ''
end
local observed = tonumber(ARGV[{o}])
local old = tonumber(known or ARGV[{o}])
local new = string.format('%.17g', old + tonumber(ARGV[{s}]) * (observed - old))
redis.call('HSET', KEYS[{k}], ARGV[{m}], new)
redis.call('PEXPIRE', KEYS[{k}], ARGV[{t}])
return new
"""

# KEYS: session hash, turn details list, calibration hash (not on a cluster). ARGV: cost, direct cost,
# direct prompt tokens, turn detail, details kept, ttl ms, model ('' = not shared), observed ratio ('' =
# none), smoothing, the session's /sessions row, its report, the calibration's cap, the turn's counts
# (TOTALS' order). One call, one round trip: the turn's usage, what the fleet view reads (proxy/state/fleet.py)
# and, with the calibration hash, _LEARN.
_USAGE = (
    """
redis.call('HINCRBYFLOAT', KEYS[1], 'cost', ARGV[1])
redis.call('HINCRBYFLOAT', KEYS[1], 'direct_cost', ARGV[2])
redis.call('HSET', KEYS[1], 'direct_prompt', ARGV[3], '"""
    + ROW_FIELD
    + """', ARGV[10], '"""
    + REPORT_FIELD
    + """', ARGV[11])
for i, name in ipairs("""
    + _TOTALS_LUA
    + """) do redis.call('HINCRBY', KEYS[1], name, ARGV[12 + i]) end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('RPUSH', KEYS[2], ARGV[4])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[5]), -1)
redis.call('PEXPIRE', KEYS[2], ARGV[6])
if not KEYS[3] then return '' end
"""
    + _LEARN.format(k=3, m=7, o=8, s=9, c=12, t=6)
)


class RedisStore(SessionStore):
    """`SessionStore` whose sessions live in Redis, shared by every process that names the same server."""

    persistent = True
    knows_idle = False
    commits = True

    def __init__(
        self,
        *,
        url: str,
        password: str | None = None,
        timeout_s: float = 0.25,
        retry_s: float = 1.0,
        cluster: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.url = url
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.cluster = cluster
        self.client = _client(url, password, timeout_s, cluster)
        self._commit = self.client.register_script(_COMMIT)
        self._usage = self.client.register_script(_USAGE)
        self._learn = self.client.register_script(_LEARN.format(k=1, m=1, o=2, s=3, c=4, t=5))
        self.fleet = FleetIndex(self.client, self.idle_ttl_s, self.clock)
        self.history = RedisHistory(self.client)
        self._flusher: asyncio.Task[None] | None = None
        self._versions: dict[str, str] = {}  # session key -> the version our copy was read or written at
        self._problem: str | None = None
        self._retry_at = 0.0
        self.bytes_written = 0  # state and usage payloads sent to Redis (for bench/state)
        self.links = ChainLinks(self.client)  # which session each relayed response was answered in
        self.max_models_shared = MAX_MODELS_SHARED

    @classmethod
    def from_config(cls, config: StateConfig, **kwargs: Any) -> RedisStore:
        password = os.environ.get(config.redis_password_env) if config.redis_password_env else None
        return cls(
            url=config.redis_url,
            password=password or None,
            timeout_s=config.redis_timeout_ms / 1000,
            retry_s=config.redis_retry_s,
            cluster=config.redis_cluster,
            max_sessions=config.max_sessions,
            max_bytes=config.memory_bytes,
            max_session_bytes=config.max_session_bytes,
            idle_ttl_s=config.idle_ttl_s,
            **kwargs,
        )

    @property
    def problem(self) -> str | None:
        return self._problem

    async def commit(self, turn: StoredTurn) -> None:
        if time.monotonic() < self._retry_at:
            return  # Redis failed a moment ago: this turn goes on from our own copy
        try:
            if turn.stored_journal is not turn.session.journal:
                await self._write_turn(turn)
            if turn.stats.prompt_tokens is not None and not turn.usage_stored:
                await self._write_usage(turn)
            await self._bounded(self.links.write(int(self.idle_ttl_s * 1000)))
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            return
        if self._problem is not None:
            log.warning("Redis at %s answers again; sessions are shared again", self._where())
            self._problem = None

    def chain(self, link: str, key: str) -> None:
        self.links.queue(link, key)

    async def chained(self, link: str) -> str | None:
        return await self._read(self.links.read(link), None, flush=False)

    def _forgotten(self, session_id: str) -> None:
        self._versions.pop(session_id, None)

    def _evicted(self, session_id: str) -> None:
        """Its next turn starts from an empty copy, which Redis refuses to commit over: the turn is re-run on
        the stored journal (`_adopt`), as when another process wrote it."""
        self._versions.pop(session_id, None)

    async def _write_turn(self, turn: StoredTurn) -> None:
        session, model, calibration = turn.session, turn.shared_model, turn.calibration
        key = session_key(session.id)
        for _ in range(_MAX_REALIGNS):
            state = await self._encode(session)
            if state is None:
                await self._bounded(self._delete(session.id))
                turn.stored_journal = session.journal
                return
            ttl = str(int(self.idle_ttl_s * 1000))
            expected = self._versions.get(session.id, "")
            args: list[Any] = [expected, state, ttl, model, secrets.token_hex(8)]
            if self.cluster:  # the calibration is in another slot: read beside the script, in the same wait
                commit = self._commit(keys=[key], args=args)
                reply, ratio = await self._bounded(asyncio.gather(commit, self.client.hget(CALIBRATION_KEY, model)))
                reply[2 if int(reply[0]) == 1 else 3] = ratio or b""
            else:
                reply = await self._bounded(self._commit(keys=[key, CALIBRATION_KEY], args=args))
            self.bytes_written += len(state)
            shared_ratio = reply[2] if int(reply[0]) == 1 else reply[3]
            if shared_ratio and model:
                calibration.ratios[model] = float(shared_ratio)
            if int(reply[0]) == 1:
                self._versions[session.id] = _text(reply[1])
                turn.stored_journal = session.journal
                return
            STATE_CONFLICTS.inc()
            self._adopt(turn, reply)
            newer = session.journal
            await turn.realign()  # after the session's other turns, off the loop when big
            if _holds_more(newer, session.journal):  # a late turn: what is stored already goes past it
                session.journal = turn.stored_journal = newer
                return
        log.warning("session %s: still behind after %d re-alignments; sent as prepared", session.id, _MAX_REALIGNS)

    def _adopt(self, turn: StoredTurn, reply: list) -> None:
        """Take the newer state another process wrote; the turn is then re-run on its journal."""
        session, version, state = turn.session, _text(reply[1]), reply[2]
        self._versions[session.id] = version
        if state:
            stored = orjson.loads(state)
            fresh = session_from(session.id, stored, orjson.dumps(stored["journal"]), b"", self._journal_from_dict)
            session.journal, session.policy = fresh.journal, fresh.policy
            session.correction, session.turn_count = fresh.correction, fresh.turn_count + 1
        else:  # no state (deleted for its size): re-run on our own
            session.journal = turn.journal_before
        session.cost_usd, session.direct_cost_usd = float(reply[4]), float(reply[5])
        session.direct_prompt_tokens = int(reply[6])
        for name, count in zip(TOTALS, reply[7:], strict=True):
            setattr(session, name, int(count))

    async def _encode(self, session: Session) -> bytes | None:
        """The session's shared state (no turn details, no costs: those follow with the usage)."""
        fields = {"policy": session.policy, "correction": session.correction, "turn_count": session.turn_count}
        if len(session.journal) > _OFFLOAD_MESSAGES:
            journal = await asyncio.to_thread(journal_bytes, session)
        else:
            journal = journal_bytes(session)
        state = orjson.dumps(fields)[:-1] + b',"journal":' + journal + b"}"
        if len(state) > self.max_session_bytes:
            STATE_TOO_LARGE.inc(store="redis")
            log.warning("session %s is over state.max_session_kb; not stored", session.id)
            return None
        return state

    async def _delete(self, session_id: str) -> None:
        """Both keys of a session (one slot: one call on a cluster too)."""
        await self.client.delete(session_key(session_id), turns_key(session_id))

    async def _write_usage(self, turn: StoredTurn) -> None:
        session, stats, model = turn.session, turn.stats, turn.shared_model
        detail = orjson.dumps(stats.to_dict())
        row, report = orjson.dumps(session.summary()), orjson.dumps(session.overview())
        observed = "" if (ratio := observed_ratio(stats.prompt_tokens or 0, turn.estimate)) is None else repr(ratio)
        ttl_ms = int(self.idle_ttl_s * 1000)
        money = [repr(stats.cost_usd or 0.0), repr(stats.direct_cost_usd or 0.0), session.direct_prompt_tokens]
        cap = self.max_models_shared
        args: list[Any] = [
            *money,
            detail,
            MAX_TURNS_KEPT,
            ttl_ms,
            model,
            observed,
            repr(RATIO_SMOOTHING),
            row,
            report,
            cap,
        ]
        args += stats.counts().values()
        keys = [session_key(session.id), turns_key(session.id)]
        if self.cluster:  # the calibration is learned in its own slot, in the same wait
            learn = self._learn(keys=[CALIBRATION_KEY], args=[model, observed, repr(RATIO_SMOOTHING), cap, ttl_ms])
            _, shared_ratio = await self._bounded(asyncio.gather(self._usage(keys=keys, args=args), learn))
        else:
            shared_ratio = await self._bounded(self._usage(keys=[*keys, CALIBRATION_KEY], args=args))
        if shared_ratio and model:
            turn.calibration.ratios[model] = float(shared_ratio)
        self.bytes_written += len(detail) + len(row) + len(report)
        turn.usage_stored = True
        self.fleet.seen(session.id, session.last_seen)
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_index())

    async def _flush_index(self) -> None:
        """The fleet index's batches, at most one a `FLUSH_S`, written beside the turns (no turn waits for them)."""
        try:
            while self.fleet.pending:
                await asyncio.sleep(self.fleet.wait_s())
                await self._bounded(self.fleet.flush())
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
        finally:
            self._flusher = None

    async def shared_rows(self, limit: int) -> list[dict[str, Any]]:
        """Every instance's `/sessions` rows (the `limit` most recent); none while Redis fails."""
        return await self._read(self.fleet.rows(limit), [])

    async def shared_report(self, session_id: str, limit: int) -> dict[str, Any] | None:
        """The `/sessions/{id}` body as the process that served the session last wrote it; None: not in Redis."""
        return await self._read(self.fleet.report(session_id, limit), None)

    async def _read(self, call: Awaitable[Any], otherwise: Any, flush: bool = True) -> Any:
        """`call`'s answer, or `otherwise` while Redis fails; `flush`: this process's own latest sessions first
        (the fleet's views; on a turn's path, a chain's link, only the read, within `redis_timeout_ms`)."""
        if time.monotonic() < self._retry_at:
            return otherwise
        try:
            async with asyncio.timeout(max(self.timeout_s, _READ_TIMEOUT_S) if flush else self.timeout_s):
                if flush:
                    await self.fleet.flush()
                return await call
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            return otherwise

    async def _bounded(self, call: Awaitable[Any]) -> Any:
        """One Redis call, never longer than `redis_timeout_ms` (connecting included)."""
        async with asyncio.timeout(self.timeout_s):
            return await call

    def _failed(self, exc: BaseException) -> None:
        reason = f"Redis at {self._where()}: {type(exc).__name__}: {exc}".rstrip(": ")
        if self._problem is None:
            log.error("%s; turns go on from this process's own state", reason)
        self._problem = reason
        self._retry_at = time.monotonic() + self.retry_s
        STATE_FAILURES.inc(store="redis")

    def _where(self) -> str:
        where = urlsplit(self.url)
        return f"{where.hostname or '?'}:{where.port or 6379}" if where.scheme != "unix" else where.path


def _holds_more(stored: Any, turn: Any) -> bool:
    """`stored` has every message of the turn's journal, and more (a later turn of the same conversation)."""
    mine = turn.digests
    return len(stored.digests) > len(mine) and stored.digests[: len(mine)] == mine


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _client(url: str, password: str | None, timeout_s: float, cluster: bool) -> Any:
    """redis-py's asyncio client; on a cluster, one that follows the slots (found on its first call)."""
    bounds: dict[str, Any] = {
        "password": password,
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),  # a failed call fails the turn's commit, never delays it
    }
    if cluster:
        return RedisCluster.from_url(url, **bounds)
    return aioredis.Redis.from_url(url, health_check_interval=0, **bounds)
