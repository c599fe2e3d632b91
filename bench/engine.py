"""The proxy's per-request work, in this process: parse, `ContextService.prepare`, serialise, record usage.

Parsing goes through `ContextService.parse_body`, as the server's does: a warm turn parses only what follows
the session's last body (proxy/service/body_memos.py).

This is what the server does for a chat request besides moving bytes; measuring it here
keeps event-loop and socket noise out of CPU figures.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import orjson

from proxy.config.loader import ConfigHolder, load_settings
from proxy.dialects import CHAT, Dialect
from proxy.service.engine_service import EngineService, build_context_service

PHASES = ("parse", "prepare", "serialise", "usage")


def service(max_sessions: int = 1000) -> EngineService:
    """A fresh ContextService on the default config, detached from file reloads."""
    settings = load_settings()
    settings = replace(settings, path="", state=replace(settings.state, max_sessions=max_sessions))
    return build_context_service(ConfigHolder(settings))


def handle(
    svc: EngineService, raw: bytes, session: str, prompt_tokens: int = 0, dialect: Dialect = CHAT
) -> tuple[Any, dict[str, float]]:
    """One request as the server handles it, minus the sockets: the turn and CPU ms per phase (chat unless told)."""
    clock = time.process_time
    t0 = clock()
    parsed = svc.parse_body(raw, path_session=session, headers={}, credential="sk-bench", dialect=dialect)
    body, digests = parsed.body, parsed.digests
    t1 = clock()
    turn = svc.prepare(
        path_session=session, headers={}, body=body, credential="sk-bench", digests=digests, dialect=dialect
    )
    t2 = clock()
    orjson.dumps(turn.body)
    t3 = clock()
    turn.record_usage([{"usage": _usage(prompt_tokens or 1)}])
    t4 = clock()
    return turn, dict(zip(PHASES, ((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t4 - t3) * 1e3), strict=True))


def _usage(prompt: int) -> dict[str, Any]:
    """A usage object every dialect reads: chat's prompt tokens, the Messages and Responses input tokens."""
    return {
        "prompt_tokens": prompt,
        "prompt_tokens_details": {"cached_tokens": 0},
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }


def reference(raw: bytes) -> bytes:
    """The floor for any proxy that rewrites the body: parse it and serialise it again."""
    return orjson.dumps(orjson.loads(raw))
