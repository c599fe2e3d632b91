"""Which conversation a request belongs to (SPEC §2), and what the proxy remembers about it.

A `Session` holds the engine's journal and per-turn statistics: a few numbers and
digests per message, never the conversation's text.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.context.journal import TurnReport
from proxy.dialects.base import Conversation, Message

MAX_ID_LENGTH = 128
SESSION_HEADER = "x-session-id"
FINGERPRINT_PREFIX = "fp-"
_FINGERPRINT = re.compile(r"fp-[0-9a-f]{32}")  # what `fingerprint` makes; a client-named id never has this form
# Turn statistics kept per session; older turns are dropped from the report, never from the journal.
MAX_TURNS_KEPT = 100  # per-turn detail kept for /sessions/{id}; totals cover every turn
# A session's own objects in memory, and one turn's details (its report and diff), measured with tracemalloc.
SESSION_BYTES = 2048
TURN_BYTES = 800
# The part of the system prompt an agent's fingerprint reads: agents write the run's date, directory or git
# status after a fixed preamble (Claude Code, Codex), which would make every run a new agent.
AGENT_SYSTEM_CHARS = 2000


def sanitize_session_id(raw: Any) -> str | None:
    """Printable ASCII without spaces, at most MAX_ID_LENGTH; None when nothing usable is left.

    A long id keeps a readable head and a hash of the whole, so two long ids never collapse into one.
    The forms the proxy makes itself are never taken from a client: an id with `@` (a credential-scoped
    key) or starting `fp-` (a fingerprint) gets the hashed form too, so it names a session of its own.
    """
    if not isinstance(raw, str):
        return None
    clean = "".join(c for c in raw if "!" <= c <= "~" and c != "@")
    if not clean:
        return None
    if clean == raw and len(clean) <= MAX_ID_LENGTH and not clean.startswith(FINGERPRINT_PREFIX):
        return clean
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{clean[: MAX_ID_LENGTH - 17]}~{digest}"


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    """The header `name` (lower case) from aiohttp's headers or a plain dict."""
    value = headers.get(name)
    if value is None and not hasattr(headers, "getall"):  # a plain dict is case-sensitive; aiohttp's are not
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value


def _first(messages: Sequence[Message], roles: tuple[str, ...]) -> int | None:
    return next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") in roles), None)


def fingerprint(credential: str, messages: Sequence[Message], digests: Sequence[bytes]) -> str:
    """A session id from who is asking and how the conversation starts (its first system and user messages).

    The credential is part of it, so two users with the same system prompt and task never share a session.
    `digests` are the engine messages' digests (what the journal keys on).
    """
    hasher = hashlib.sha256(hashlib.sha256(credential.encode("utf-8", "surrogatepass")).digest())
    for roles in (("system", "developer"), ("user",)):
        i = _first(messages, roles)
        hasher.update(b"-" if i is None else digests[i])
    return f"{FINGERPRINT_PREFIX}{hasher.hexdigest()[:32]}"


def agent_fingerprint(credential: str, conversation: Conversation, notes: dict[str, Any] | None = None) -> str:
    """Which agent a session is a run of: what stays fixed across its runs (the tools' names and schemas, the
    start of the system prompt), within the credential's scope, so two tenants never share a history.

    `notes`: a dict that comes back only while the credential and the tools are the same (a body memo's,
    proxy.service.body_memos); the fingerprint is kept there and reused while the system message is the same
    object, so a warm turn does not dump and hash the tools again."""
    i = _first(conversation.messages, ("system", "developer"))
    system = conversation.messages[i] if i is not None else None
    known = notes.get("agent") if notes is not None else None
    if known is not None and known[0] is system:
        return str(known[1])
    hasher = hashlib.sha256(hashlib.sha256(credential.encode("utf-8", "surrogatepass")).digest())
    if conversation.tools:
        hasher.update(orjson.dumps(conversation.tools, option=orjson.OPT_SORT_KEYS, default=repr))
    hasher.update(b"\x00")
    if system is not None:
        content = system.get("content")
        text = content if isinstance(content, str) else orjson.dumps(content, default=repr).decode()
        hasher.update(text[:AGENT_SYSTEM_CHARS].encode("utf-8", "surrogatepass"))
    found = hasher.hexdigest()[:24]
    if notes is not None:
        notes["agent"] = (system, found)
    return found


def session_id_for(
    path_session: str | None,
    headers: Mapping[str, str],
    hints: Sequence[Any],
    credential: str,
    conversation: Conversation,
) -> str:
    """SPEC §2's order: the `/s/{id}/v1` path, `X-Session-Id`, the dialect's own hints, else a fingerprint.

    Chat's hint is `metadata.session_id`; other APIs name theirs (`proxy.dialects`).
    """
    for raw in (path_session, header_value(headers, SESSION_HEADER), *hints):
        session_id = sanitize_session_id(raw)
        if session_id:
            return session_id
    return fingerprint(credential, conversation.messages, conversation.digests)


def scoped_key(session_id: str, credential: str) -> str:
    """Where a session's state is kept: a named session is scoped by the client's credential.

    Two clients that pick the same `X-Session-Id` (or `/s/{id}`) never read or disturb each
    other's journal; a fingerprinted id already includes the credential.
    """
    if not credential or _FINGERPRINT.fullmatch(session_id):
        return session_id
    client = hashlib.sha256(credential.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{session_id}@{client}"


def visible_id(key: str) -> str:
    """The session id as the client named it, without the credential scope (or a conversation's suffix)."""
    return key.split("@", 1)[0]  # a client's id never has an "@" (sanitize_session_id)


def savings(cost_usd: float, direct_cost_usd: float) -> dict[str, float]:
    """What was billed through the proxy, what the same turns would have cost sent direct, and the difference:
    the one way a saving is stated (a session's, the totals', a turn's log line); negative when the edits cost more."""
    return {"cost_usd": cost_usd, "direct_cost_usd": direct_cost_usd, "saved_usd": direct_cost_usd - cost_usd}


@dataclass(slots=True)
class TurnStats:
    """One turn as `GET /sessions/{id}` shows it: the engine's report plus what the upstream billed."""

    report: TurnReport | None = None  # kept as the engine's object: half the memory of its dict form
    model: str = ""
    window: int | None = None  # the context window the proxy used for this turn ...
    model_entry: str = ""  # ... from this entry of the model table (a glob; "*" = the fallback)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    direct_cost_usd: float | None = None  # the same turn sent unedited, as estimated from our counts
    retried: bool = False
    api: str = "chat"  # the dialect's name: chat, responses, messages
    unedited: str | None = None  # why the turn went upstream as sent (Responses: previous_response_id, conversation)

    def counts(self) -> dict[str, int]:
        """What this billed turn adds to its session's totals (`Session.count_usage`; a shared store adds the same)."""
        report = self.report
        return {
            "tokens_before_total": report.tokens_before if report else 0,
            "tokens_after_total": report.tokens_after if report else 0,
            "billed_tokens": self.prompt_tokens or 0,
            "billed_cached_tokens": self.cached_tokens or 0,
            "overflows_rescued": int(self.retried or bool(report and report.over_window)),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **(self.report.to_dict() if self.report is not None else {}),
            "api": self.api,
            "unedited": self.unedited,
            "model": self.model,
            "window": self.window,
            "model_entry": self.model_entry,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "cost_usd": self.cost_usd,
            "direct_cost_usd": self.direct_cost_usd,
            "retried": self.retried,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TurnStats:
        data = dict(data)
        names = ("model", "window", "model_entry", "prompt_tokens", "cached_tokens", "retried", "api", "unedited")
        fields = {k: data.pop(k) for k in names if k in data}
        costs = {k: data.pop(k) for k in ("cost_usd", "direct_cost_usd") if k in data}
        report = TurnReport.from_dict(data) if "turn" in data else None
        return cls(report=report, **fields, **costs)


@dataclass
class Session:
    """One conversation: its journal, the policy it runs under, and what each turn cost."""

    id: str
    journal: Any  # proxy.context.journal.Journal
    policy: str = "default"
    turns: list[TurnStats] = field(default_factory=list)
    turn_count: int = 0
    last_seen: float = 0.0
    # Seconds from the session's previous request to this one, by this process's clock (0: the first).
    idle_s: float = 0.0
    # Which agent it is a run of (`agent_fingerprint`; '' until its first edited turn in this process).
    agent: str = ""
    # The length the session was last counted finished at (0: never): it joins its agent's history once per length.
    finished_at: int = 0
    # Upstream prompt tokens per token we estimated, as a context_length_exceeded retry taught it:
    # a floor under the model's learned ratio for this session (0 = nothing learned).
    correction: float = 0.0
    # The direct (unedited) prompt size of the previous turn, for the direct-cost estimate.
    direct_prompt_tokens: int = 0
    # Input cost over every turn, proxied and as estimated direct (turn details are only the recent ones).
    cost_usd: float = 0.0
    direct_cost_usd: float = 0.0
    # What the last turn asked (the digest of its messages), in this process: the same request again, after
    # an answer without usage (an upstream error the client retries), is that turn again, not a new one.
    last_request: bytes = field(default=b"", repr=False, compare=False)
    # Over every turn the upstream answered (`count_usage`): our counts of what the client sent and what went
    # upstream, the billed prompt and cached tokens, and turns direct would have overflowed that went through.
    tokens_before_total: int = 0
    tokens_after_total: int = 0
    billed_tokens: int = 0
    billed_cached_tokens: int = 0
    overflows_rescued: int = 0
    # Held while a turn is prepared: the engine may run on a worker thread (large bodies) and on the loop.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # What the store last counted this session as holding (`approx_bytes` when it last changed).
    held_bytes: int = field(default=0, repr=False, compare=False)

    def approx_bytes(self) -> int:
        """What the session holds in memory, roughly: its journal's sums of lengths and its turn details."""
        return SESSION_BYTES + 2 * len(self.id) + TURN_BYTES * len(self.turns) + self.journal.approx_bytes()

    def add_turn(self, stats: TurnStats, *, retry: bool = False) -> None:
        """A new turn; `retry`: the client sent the last one again (it got no answer): it takes its place."""
        if retry and self.turns:
            self.turns[-1] = stats
            return
        self.turns.append(stats)
        self.turn_count += 1
        if len(self.turns) > MAX_TURNS_KEPT:
            del self.turns[: len(self.turns) - MAX_TURNS_KEPT]

    def count_usage(self, stats: TurnStats) -> None:
        """Add a turn the upstream billed (`stats` priced) to the session's totals."""
        self.cost_usd += stats.cost_usd or 0.0
        self.direct_cost_usd += stats.direct_cost_usd or 0.0
        for name, count in stats.counts().items():
            setattr(self, name, getattr(self, name) + count)

    @property
    def last_report(self) -> TurnReport | None:
        """The engine's report of the latest turn (None before one, or when it went upstream unedited)."""
        return self.turns[-1].report if self.turns else None

    def summary(self) -> dict[str, Any]:
        """The `GET /sessions` row (and the dashboard's, and `context-proxy stats`'): no message text.

        The one place a session's savings are computed: every view reads `saved_usd` from here.
        """
        last = self.last_report
        latest = self.turns[-1] if self.turns else None
        return {
            "id": visible_id(self.id),
            "key": self.id,  # the id scoped by the client's credential: where the state is kept
            "policy": self.policy,
            "api": latest.api if latest else None,
            "model": latest.model if latest else None,
            "turns": self.turn_count,
            "tokens_before": last.tokens_before if last else None,
            "tokens_after": last.tokens_after if last else None,
            "last_seen": self.last_seen,
            **savings(self.cost_usd, self.direct_cost_usd),
            "tokens_before_total": self.tokens_before_total,
            "tokens_after_total": self.tokens_after_total,
            "billed_tokens": self.billed_tokens,
            "billed_cached_tokens": self.billed_cached_tokens,
            "overflows_rescued": self.overflows_rescued,
            **self.journal.summary(),  # epochs, banked, recall_misses, cleared_reruns, miss_heat
        }

    def to_dict(self) -> dict[str, Any]:
        """The `GET /sessions/{id}` body: the row, and per recent turn what the engine did and what it cost."""
        return with_cumulative_costs({**self.overview(), "turn_details": [t.to_dict() for t in self.turns]})

    def overview(self) -> dict[str, Any]:
        """The `GET /sessions/{id}` body but the turn details (what a shared store keeps beside them)."""
        last = self.last_report
        return {
            **self.summary(),
            "idle_s": round(self.idle_s, 3),
            "agent": self.agent,
            "clearing_held_back_tokens": last.held_back if last else 0,
            "correction": self.correction,
        }


def with_cumulative_costs(report: dict[str, Any]) -> dict[str, Any]:
    """A `/sessions/{id}` body whose turn details say the session's cost so far at each turn (proxied and direct):
    counted back from the session's totals, so the last turn's equals them even when older turns are no longer
    kept. Every store's report goes through it (the memory copy's and the fleet's)."""
    cost, direct = report["cost_usd"], report["direct_cost_usd"]
    for detail in reversed(report["turn_details"]):
        detail["cumulative_cost_usd"], detail["cumulative_direct_cost_usd"] = cost, direct
        cost -= detail.get("cost_usd") or 0.0
        direct -= detail.get("direct_cost_usd") or 0.0
    return report


# The `GET /sessions` row fields that add up over sessions (and a session's conversations) into totals.
SUMMED = (
    "turns",
    "cost_usd",
    "direct_cost_usd",
    "tokens_before_total",
    "tokens_after_total",
    "billed_tokens",
    "billed_cached_tokens",
    "overflows_rescued",
    "epochs",
    "recall_misses",
)


def totals(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The proxy's totals (`GET /stats`, the dashboard, `context-proxy stats`): the sum of the `GET /sessions`
    rows, so the totals always equal what the sessions table adds up to. `cache_hit_rate`: billed cached tokens
    per billed prompt token (None before any)."""
    rows = list(rows)
    out: dict[str, Any] = {"sessions": len(rows)}
    for name in SUMMED:
        out[name] = sum(row.get(name) or 0 for row in rows)
    out.update(savings(out["cost_usd"], out["direct_cost_usd"]))
    out["cache_hit_rate"] = out["billed_cached_tokens"] / out["billed_tokens"] if out["billed_tokens"] else None
    return out
