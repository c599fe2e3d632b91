"""One session, many conversations: each keeps its own journal, so switching between them resets none.

An agent sends several conversations under one session id: Claude Code's main thread, its subagents
(the Task tool) and its title and side requests all carry the same `X-Claude-Code-Session-Id`. One
journal for all of them would realign to 0 at every switch and never replay the main thread's edits
(its cache read falls to system + tools). So a conversation is known by its head, the messages up to
its first user message (system prompt and task), and each head other than the session's own gets a
session of its own, stored under the session's key plus `@@` and a digest of that head: deterministic,
so every process and worker finds the same one. The session keeps the conversation it started with
(its journal's head); `/sessions` shows one row per session and `/sessions/{id}` each conversation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from proxy.dialects.base import Conversation
from proxy.state.memory import SessionStore
from proxy.state.sessions import SUMMED, Session, totals

SEPARATOR = "@@"  # never in a client's id (sanitize_session_id drops every "@"), once in a scoped key at most
MAX_CONVERSATIONS = 16  # besides the session's own, per session; the least recently seen is forgotten past it


def head(conversation: Conversation) -> list[bytes]:
    """The digests of the engine messages up to and including the first user message: what starts it."""
    for i, message in enumerate(conversation.messages):
        if message.get("role") == "user":
            return list(conversation.digests[: i + 1])
    return list(conversation.digests[:1])


def conversation_key(key: str, digests: Sequence[bytes]) -> str:
    return f"{key}{SEPARATOR}{hashlib.sha256(b''.join(digests)).hexdigest()[:16]}"


def session_key(key: str) -> str:
    """The key of the session a conversation's key belongs to (a session's own key: itself)."""
    return key.split(SEPARATOR, 1)[0]


def _owns(session: Session, digests: Sequence[bytes]) -> bool:
    """The session's journal starts as this conversation does (or is empty: it takes the first that comes)."""
    journal = session.journal.digests
    return not journal or journal[: len(digests)] == list(digests)


def for_conversation(store: SessionStore, key: str, conversation: Conversation) -> Session:
    """The session that keeps this conversation's journal: the named session's own, or one of its conversations."""
    start = head(conversation)
    own = store.peek(key)  # a peek: another conversation's request leaves the session's idle time alone
    if own is None or _owns(own, start):
        return store.get(key)
    sub = conversation_key(key, start)
    if store.peek(sub) is None:
        others = conversations(store, key)
        for stale in sorted(others, key=lambda s: s.last_seen)[: max(0, len(others) - MAX_CONVERSATIONS + 1)]:
            store.forget(stale.id)
    return store.get(sub)


def conversations(store: Iterable[Session], key: str) -> list[Session]:
    """The sessions keeping the other conversations of session `key`, in no particular order."""
    prefix = key + SEPARATOR
    return [s for s in store if s.id.startswith(prefix)]


def rows(listed: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """`GET /sessions` rows (`Session.summary()`, this process's or the fleet's), each session's conversations folded
    into one row: its own conversation's, with the counts and costs over all of them and the latest last_seen."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in listed:
        groups.setdefault(session_key(row["key"]), []).append(row)
    folded = []
    for key, group in groups.items():
        own = min(group, key=lambda r: (r["key"] != key, -r["last_seen"]))
        summed = totals(group)  # turns, costs, saved, token and overflow counts, epochs: over every conversation
        folded.append(
            {**own, **{name: summed[name] for name in (*SUMMED, "saved_usd")}, "key": key,
             "last_seen": max(r["last_seen"] for r in group), "conversations": len(group)}
        )  # fmt: skip
    return folded


def detail(group: Sequence[Session]) -> dict[str, Any]:
    """`GET /sessions/{id}` of `group` (a session, then its other conversations): its own conversation's turns,
    the totals of all, and a row per conversation (each with its turns)."""
    own, others = group[0], sorted(group[1:], key=lambda s: -s.last_seen)
    group = [own, *others]
    details = [s.summary() | {"turn_details": [t.to_dict() for t in s.turns]} for s in others]
    # The own conversation's turn details (their cumulative costs its own), the totals of every conversation.
    return {**own.to_dict(), **rows(s.summary() for s in group)[0], "conversations": [own.summary(), *details]}
