"""A Responses refusal for length, read where the API writes it: a 400's error, or a streamed `error` or
`response.failed` event, before which it sends only its prelude events (the shell holds those back until it knows).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.dialects.chat import stated_prompt_tokens

# Events the API sends before it may still refuse a streamed request (context_length_exceeded).
PRELUDE_EVENTS = (b"response.created", b"response.in_progress", b"response.queued")
OVERFLOW_CODE = "context_length_exceeded"
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_EVENT_TYPE = re.compile(rb'"type"\s*:\s*"([^"]+)"')


def _sse_events(head: bytes) -> list[bytes]:
    """The complete events at the start of an SSE body."""
    events, at = [], 0
    while match := _EVENT_END.search(head, at):
        events.append(head[at : match.start()])
        at = match.end()
    return events


def _event_data(event: bytes) -> Any:
    data = b"\n".join(line[5:].removeprefix(b" ") for line in event.splitlines() if line.startswith(b"data:"))
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _overflow_count(error: Any) -> int | None:
    """The prompt size a `context_length_exceeded` error states, 0 when it states none; None for another error."""
    if not isinstance(error, dict) or error.get("code") != OVERFLOW_CODE:
        return None
    return stated_prompt_tokens(str(error.get("message") or "")) or 0


def stream_undecided(head: bytes) -> bool:
    """True while a streamed answer has sent only what comes before a possible refusal (read on, hold it)."""
    events = _sse_events(head)
    return all(
        (match := _EVENT_TYPE.search(event)) is not None and match.group(1) in PRELUDE_EVENTS for event in events
    )


def overflow_tokens(status: int, body: bytes) -> int | None:
    """A refusal for length: a 400, or a streamed `error` / `response.failed` event (0: size not stated)."""
    if status == 400:
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        return _overflow_count(payload.get("error")) if isinstance(payload, dict) else None
    if status != 200:
        return None
    for event in _sse_events(body):
        payload = _event_data(event)
        if not isinstance(payload, dict):
            continue
        if payload.get("type") == "error":
            found = _overflow_count(payload.get("error", payload))
        elif payload.get("type") == "response.failed" and isinstance(payload.get("response"), dict):
            found = _overflow_count(payload["response"].get("error"))
        else:
            continue
        if found is not None:
            return found
    return None
