"""Where the shared state lives in Redis: one hash slot per session, so it runs on a Redis Cluster too.

A Lua script may only touch keys of one hash slot on a cluster. Every key of one session carries
the same hash tag (the part between braces: `context-proxy:session:{agent-42@3f2a}`), so its state
and its turn details are always on one node and one script writes both. The keys every session
shares (the learned calibration, the index of recent sessions) are single keys of their own slot,
written by calls of their own. A session id may hold braces: those are escaped in the tag, so the
tag is always the whole id and two ids never share one.
"""

from __future__ import annotations

PREFIX = "context-proxy:"
CALIBRATION_KEY = PREFIX + "calibration"  # hash: model -> learned ratio (repr of a float)
INDEX_KEY = PREFIX + "sessions"  # sorted set: session key -> when it was last seen (unix seconds)


def _tag(session_id: str) -> str:
    return "{" + session_id.replace("%", "%25").replace("{", "%7B").replace("}", "%7D") + "}"


def session_key(session_id: str) -> str:
    """The session's hash: version, state, costs, and its /sessions row and report."""
    return f"{PREFIX}session:{_tag(session_id)}"


def turns_key(session_id: str) -> str:
    """The session's recent turn details (a list), in the same slot as its hash."""
    return f"{PREFIX}turns:{_tag(session_id)}"


def chain_key(link: str) -> str:
    """The session a response was answered in (`link`: its id hashed with the credential, hex), for the next link
    of a `previous_response_id` chain; it expires with the idle TTL."""
    return f"{PREFIX}chain:{link}"
