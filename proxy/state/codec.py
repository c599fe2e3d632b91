"""A session as stored (SQLite row, Redis value): JSON-safe fields, never message text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from proxy.state.sessions import Session, TurnStats

# The scalar fields a stored session carries besides its journal and turn details.
FIELDS = ("policy", "last_seen", "correction", "direct_prompt_tokens", "turn_count", "cost_usd", "direct_cost_usd")
# The session's counts over every billed turn (`Session.count_usage`), stored together (SQLite: one JSON column).
TOTALS = ("tokens_before_total", "tokens_after_total", "billed_tokens", "billed_cached_tokens", "overflows_rescued")


def journal_bytes(session: Session) -> bytes:
    return orjson.dumps(session.journal.to_dict())


def turns_bytes(session: Session) -> bytes:
    return orjson.dumps([t.to_dict() for t in list(session.turns)])


def totals_bytes(session: Session) -> bytes:
    return orjson.dumps({name: getattr(session, name) for name in TOTALS})


def session_from(
    key: str,
    fields: dict[str, Any],
    journal: bytes,
    turns: bytes,
    journal_from_dict: Callable[[dict], Any],
    *,
    totals: bytes | str = b"{}",
) -> Session:
    """Rebuild a session from its stored parts (`totals`: `totals_bytes`); raises ValueError (or orjson's) on a
    damaged one."""
    fields = {**fields, **orjson.loads(totals)}
    session = Session(id=key, journal=journal_from_dict(orjson.loads(journal)))
    session.turns = [TurnStats.from_dict(t) for t in orjson.loads(turns)] if turns else []
    for name in (*FIELDS, *TOTALS):
        if name in fields and fields[name] is not None:
            default = getattr(session, name)
            setattr(session, name, type(default)(fields[name]))
    return session
