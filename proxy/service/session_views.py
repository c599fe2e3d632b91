"""What `GET /sessions` and `GET /sessions/{id}` show: this process's copy of a session, or the shared store's
when another process served it since (each as its latest writer left it)."""

from __future__ import annotations

from typing import Any

from proxy.service.session_ends import SessionEnds
from proxy.state import SessionStore, conversations
from proxy.state.sessions import visible_id


async def rows(store: SessionStore) -> list[dict[str, Any]]:
    """`GET /sessions`: one row per session, most recent first, every process's when the store is shared
    (each row as its latest writer left it); at most `[state] max_sessions`; no message text."""
    limit = store.max_sessions
    found = {row["key"]: row for row in await store.shared_rows(limit)}
    for session in store:
        row = found.get(session.id)
        if row is None or session.last_seen >= row["last_seen"]:  # our copy is the latest one
            found[session.id] = session.summary()
    folded = conversations.rows(found.values())  # a session's conversations in its one row
    return sorted(folded, key=lambda row: row["last_seen"], reverse=True)[:limit]


async def detail(store: SessionStore, ends: SessionEnds, session_id: str) -> dict[str, Any] | None:
    """`GET /sessions/{id}`: per turn, what the engine did and what the upstream billed; from this process's
    copy, or the shared store's when another process served the session since."""
    await ends.sweep_if_due()
    session = store.peek(session_id)
    if session is None:  # the id as the client named it: the most recent client's session of that name
        named = [s for s in store if visible_id(s.id) == session_id and conversations.session_key(s.id) == s.id]
        session = max(named, key=lambda s: s.last_seen, default=None)
    shared = await store.shared_report(session_id, store.max_sessions)
    if session is not None and (shared is None or session.last_seen >= shared["last_seen"]):
        return ends.describe(conversations.detail([session, *conversations.conversations(store, session.id)]))
    return None if shared is None else ends.describe(shared)
