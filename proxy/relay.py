"""Streams an upstream response to the client: bytes as they arrive, never re-serialised.

For chat completions it also reads `usage` on the way past (from the JSON body or the
SSE usage chunk) and, when the engine asked upstream for that chunk, removes it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping

import aiohttp
import orjson
from aiohttp import web

from proxy.errors import error_response
from proxy.metrics import METRICS
from proxy.seam import PreparedTurn
from proxy.upstream import end_to_end

log = logging.getLogger("proxy.relay")

STREAMS_IN_FLIGHT = METRICS.gauge("context_proxy_streams_in_flight", "Responses being relayed to clients right now")
BROKEN_STREAMS = METRICS.counter(
    "context_proxy_upstream_broken_total", "Upstream responses that failed after their headers", ["route"]
)

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_EVENT_ENDINGS = (b"\r\n\r\n", b"\n\n", b"\r\r")  # what _EVENT_END finds, at a chunk's end
# A usage object, not `"usage": null` (which OpenAI puts in every chunk once usage is asked for).
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
_MAX_JSON_CAPTURE = 8 * 1024 * 1024  # a non-streaming body kept aside for its usage, up to this size


class SseUsageFilter:
    """Splits an SSE byte stream into events to read `usage`, optionally dropping the usage-only event.

    Without stripping, every chunk is forwarded as it came and events are only read; with
    stripping, complete events are forwarded and only an incomplete trailing one is held.
    """

    def __init__(self, strip_usage_chunk: bool) -> None:
        self.strip = strip_usage_chunk
        self.payloads: list[dict] = []  # every event payload that held a usage object, in order
        self._pending = bytearray()

    def feed(self, chunk: bytes) -> bytes:
        if not self._pending and chunk.endswith(_EVENT_ENDINGS) and not _USAGE_OBJECT.search(chunk):
            return chunk  # whole events, none with usage: nothing to read or hold (most chunks)
        self._pending += chunk
        end = _last_event_end(self._pending)
        complete = bytes(self._pending[:end])
        del self._pending[:end]
        out = self._events(complete) if complete else b""
        return out if self.strip else chunk

    def _events(self, data: bytes) -> bytes:
        """Whole events: each one holding a usage object is read (and dropped if usage-only); the rest pass as one."""
        pieces, done = [], 0
        for match in _USAGE_OBJECT.finditer(data):
            if match.start() < done:
                continue  # inside the event just handled
            begin = max(done, _last_event_end(data, match.start()))
            stop = _EVENT_END.search(data, match.end())
            stop_at = stop.end() if stop else len(data)
            event = data[begin:stop_at]
            pieces.append(data[done:begin])
            if not (self._read(event) and self.strip):
                pieces.append(event)
            done = stop_at
        if not done:
            return data
        pieces.append(data[done:])
        return b"".join(pieces)

    def finish(self) -> bytes:
        """What is left at the end of the stream (an event without its blank line)."""
        rest = bytes(self._pending)
        self._pending.clear()
        if rest and self._read(rest) and self.strip:
            return b""
        return rest if self.strip else b""

    @property
    def usage(self) -> dict | None:
        """The last top-level usage object seen (chat's usage chunk)."""
        usages = [p["usage"] for p in self.payloads if isinstance(p.get("usage"), dict)]
        return usages[-1] if usages else None

    def _read(self, event: bytes) -> bool:
        """Keep the payload of an event holding usage; True when it is chat's usage-only chunk (`choices == []`)."""
        if not _USAGE_OBJECT.search(event):
            return False
        data = b"\n".join(line[5:].removeprefix(b" ") for line in event.splitlines() if line.startswith(b"data:"))
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(payload, dict):
            return False
        self.payloads.append(payload)
        return isinstance(payload.get("usage"), dict) and payload.get("choices") == []


def _last_event_end(data: bytes | bytearray, before: int | None = None) -> int:
    """Where the last complete event in `data[:before]` ends (0 when there is none)."""
    before = len(data) if before is None else before
    if data.endswith(_EVENT_ENDINGS, 0, before):
        return before  # the usual read: whole events
    end = 0
    for separator in _EVENT_ENDINGS:
        at = data.rfind(separator, 0, before)
        if at >= 0:
            end = max(end, at + len(separator))
    return end


async def read_head(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """Up to `cap` bytes of the body (an error small enough to inspect before relaying)."""
    body = bytearray()
    while len(body) < cap and (chunk := await response.content.read(cap - len(body))):
        body += chunk
    return bytes(body)


def response_headers(upstream: aiohttp.ClientResponse, extra: Mapping[str, str], *, body_changes: bool) -> dict:
    """The upstream's end-to-end headers plus the turn's X-Context-* headers."""
    drop = frozenset({"content-length"}) if body_changes else frozenset()
    headers = end_to_end(upstream.headers, drop)
    headers.update(extra)
    return headers  # type: ignore[return-value]


def _payload_from_json(body: bytes) -> list[dict]:
    """The response body as the one payload usage is read from ([] when it is not a JSON object)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return []
    return [payload] if isinstance(payload, dict) else []


def _break_connection(request: web.Request) -> None:
    """End the client's response without a clean end, so it cannot mistake it for complete."""
    if request.transport is not None:
        request.transport.close()


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    *,
    turn: PreparedTurn | None = None,
    route: str = "passthrough",
    prefix: bytes = b"",
) -> web.StreamResponse:
    """Relay `upstream` to the client; `prefix` is body already read from it (an error being checked)."""
    is_sse = upstream.content_type == "text/event-stream"
    reads_usage = turn is not None and upstream.status < 400
    sse = SseUsageFilter(turn.strip_usage_chunk) if reads_usage and is_sse else None
    captured = bytearray() if reads_usage and not is_sse else None
    extra = turn.headers if turn is not None else {}
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    response.headers.update(response_headers(upstream, extra, body_changes=sse is not None and sse.strip))
    STREAMS_IN_FLIGHT.inc()
    completed = False
    try:
        chunks = upstream.content.iter_any()
        first = prefix or await anext(chunks, b"")
        # Headers go out with the first body bytes: an upstream that breaks before them still gets a 502.
        await response.prepare(request)
        pending = first
        while pending:
            out = pending
            if sse is not None:
                out = sse.feed(pending)
            elif captured is not None and len(captured) < _MAX_JSON_CAPTURE:
                captured += pending
            if out:
                await response.write(out)
            pending = await anext(chunks, b"")
        if sse is not None and (rest := sse.finish()):
            await response.write(rest)
        completed = True
    except ConnectionResetError:  # writing to a client that is gone (aiohttp's is also a ClientError)
        log.info("client went away during a %s response", route)
        return response
    except (TimeoutError, aiohttp.ClientError) as exc:
        BROKEN_STREAMS.inc(route=route)
        log.warning("upstream broke mid-response (%s); ending the client's stream", type(exc).__name__)
        if not response.prepared:
            return _error_before_headers(exc)
        _break_connection(request)
        return response
    finally:
        STREAMS_IN_FLIGHT.dec()
        if completed:
            upstream.release()
        else:  # client gone, cancelled, or upstream broken: drop the upstream connection now
            upstream.close()
    payloads = sse.payloads if sse is not None else _payload_from_json(captured) if captured else []
    if payloads and turn is not None:
        try:
            turn.record_usage(payloads)
        except Exception:  # the answer is already delivered; a bookkeeping bug must not turn it into a 500
            log.exception("recording usage failed")
    return response


def _error_before_headers(exc: BaseException) -> web.Response:
    if isinstance(exc, asyncio.TimeoutError):
        return error_response(504, "The upstream stopped sending before its response began.", "upstream_timeout")
    return error_response(502, "The upstream broke off before its response began.", "upstream_broken")
