"""Streams an upstream response to the client: bytes as they arrive, never re-serialised.

For a turn it also reads `usage` on the way past (from the JSON body or the SSE events
holding it) and, when the engine asked upstream for chat's usage chunk, removes it. An SSE
stream of a known API that ends before its end marker gets one error event in that API's
form, so the client's SDK raises instead of keeping half an answer (proxy/shell/stream_ends.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Mapping

import aiohttp
import orjson
from aiohttp import web

from proxy.errors import UpstreamError
from proxy.metrics import METRICS
from proxy.service.seam import PreparedTurn
from proxy.shell.sse_framing import MAX_EVENT_BYTES, Piece, SseEvents, event_around, event_data
from proxy.shell.stream_ends import STREAM_APIS, EndWatch
from proxy.shell.upstream import end_to_end

log = logging.getLogger("proxy.relay")

STREAMS_IN_FLIGHT = METRICS.gauge("context_proxy_streams_in_flight", "Responses being relayed to clients right now")
BROKEN_STREAMS = METRICS.counter(
    "context_proxy_upstream_broken_total", "Upstream responses that failed after their headers", ["route"]
)

# A usage object, not `"usage": null` (which OpenAI puts in every chunk once usage is asked for).
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
_MAX_JSON_CAPTURE = 8 * 1024 * 1024  # a non-streaming body kept aside for its usage, up to this size


class SseUsageFilter:
    """Relays an SSE stream event by event: reads usage, may drop chat's usage-only event, watches for the end.

    Whole events go on as they complete and an unfinished one is held (proxy/shell/sse_framing.py), so a
    stream cut mid-event ends on a whole event; an event past the bound is relayed as it
    comes and never parsed. `watch` (proxy/shell/stream_ends.py) follows every byte relayed.
    """

    def __init__(
        self,
        strip_usage_chunk: bool = False,
        *,
        reads_usage: bool = True,
        watch: EndWatch | None = None,
        bound: int = MAX_EVENT_BYTES,
    ) -> None:
        self.strip = strip_usage_chunk
        self.reads_usage = reads_usage
        self.watch = watch
        self.payloads: list[dict] = []  # every event payload that held a usage object, in order
        self.events = SseEvents(bound)
        self.fed = 0  # bytes read from the upstream so far

    @property
    def cut(self) -> bool:
        """The stream has not reached its API's end marker (so far)."""
        return self.watch is not None and not self.watch.ended

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to relay now."""
        self.fed += len(chunk)
        events = self.events
        if events.takes_whole(chunk):  # the usual read, whole events: what SseEvents.feed would make one piece
            if self.watch is not None:
                self.watch.see_whole(chunk)
            if self.reads_usage and _USAGE_OBJECT.search(chunk):
                return self._read_events(chunk)
            return chunk
        pieces = events.feed(chunk)
        if len(pieces) == 1:
            return self._relayed(pieces[0])
        return b"".join([self._relayed(piece) for piece in pieces])

    def _relayed(self, piece: Piece) -> bytes:
        if self.watch is not None:
            self.watch.see(piece)
        if piece.whole and self.reads_usage and _USAGE_OBJECT.search(piece.data):
            return self._read_events(piece.data)
        return piece.data

    def finish(self) -> bytes:
        """At the upstream's clean end: its unfinished last event, unless the stream is cut (then dropped)."""
        rest = self.events.finish()
        if not rest:
            return b""
        if self.cut:
            return b""  # an SSE client discards an event without its blank line anyway
        if self.reads_usage and self._read(rest) and self.strip:
            return b""
        return rest

    @property
    def usage(self) -> dict | None:
        """The last top-level usage object seen (chat's usage chunk)."""
        usages = [p["usage"] for p in self.payloads if isinstance(p.get("usage"), dict)]
        return usages[-1] if usages else None

    def _read_events(self, data: bytes) -> bytes:
        """Whole events: each one holding a usage object is read (and dropped if usage-only and stripping).

        Only the events a usage object stands in are found (`event_around`), not every event of the read:
        a proxy reading a whole stream at once would otherwise walk hundreds of events for the one or two.
        """
        kept, keep_from = [], 0
        match = _USAGE_OBJECT.search(data)
        while match is not None:
            start, end = event_around(data, match.start())
            if self._read(data[start:end]) and self.strip:
                kept.append(data[keep_from:start])
                keep_from = end
            match = _USAGE_OBJECT.search(data, end)
        if not keep_from:
            return data
        kept.append(data[keep_from:])
        return b"".join(kept)

    def _read(self, event: bytes) -> bool:
        """Keep the payload of an event holding usage; True when it is chat's usage-only chunk (`choices == []`)."""
        if len(event) > self.events.bound or not _USAGE_OBJECT.search(event):
            return False
        try:
            payload = orjson.loads(event_data(event))
        except orjson.JSONDecodeError:
            return False
        if not isinstance(payload, dict):
            return False
        self.payloads.append(payload)
        return isinstance(payload.get("usage"), dict) and payload.get("choices") == []


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


def _payload_from_json(body: bytes | bytearray) -> list[dict]:
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


def _sse_filter(upstream: aiohttp.ClientResponse, turn: PreparedTurn | None, api: str | None) -> SseUsageFilter | None:
    """The filter an SSE answer goes through: usage for a turn, the end watch for a known API; None for neither."""
    if upstream.content_type != "text/event-stream" or upstream.status >= 400:
        return None
    watch = EndWatch(STREAM_APIS[api]) if api in STREAM_APIS else None
    if turn is None and watch is None:
        return None
    strip = turn is not None and turn.strip_usage_chunk
    return SseUsageFilter(strip, reads_usage=turn is not None, watch=watch)


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    *,
    turn: PreparedTurn | None = None,
    route: str = "passthrough",
    prefix: bytes = b"",
    api: str | None = None,
) -> web.StreamResponse:
    """Relay `upstream` to the client; `prefix` is body already read from it (an error being checked).

    `api` ("chat", "responses", "messages"): the API an SSE answer speaks; a stream that ends
    before that API's end marker gets one error event in its form (proxy/shell/stream_ends.py).
    """
    sse = _sse_filter(upstream, turn, api)
    reads_json = turn is not None and upstream.status < 400 and upstream.content_type != "text/event-stream"
    captured = bytearray() if reads_json else None
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    # A JSON answer goes chunked when the turn is written to a shared store after it: with its length the
    # client would hold it whole before that write, and could send the next link of a chain to another
    # instance that does not know it yet (the handler's end, after the commit, ends a chunked answer).
    rechunked = turn is not None and reads_json and turn.commits
    body_changes = (sse is not None and (sse.strip or sse.watch is not None)) or rechunked
    response.headers.update(response_headers(upstream, turn.headers if turn else {}, body_changes=body_changes))
    STREAMS_IN_FLIGHT.inc()
    completed = False
    try:
        await _copy(request, upstream, response, sse, captured, prefix)
        completed = True
    except (ConnectionResetError, asyncio.CancelledError) as exc:  # the client hung up (aiohttp cancels on it)
        if not response.prepared or not hung_up(request, exc):
            raise  # before the answer began: the request is answered as gone (shell/server.Observe)
        log.info("client went away during a %s response", route)
        _record_usage(turn, sse, captured)  # it may hang up right after the last event (Codex does)
        return response
    except (TimeoutError, aiohttp.ClientError) as exc:
        BROKEN_STREAMS.inc(route=route)
        await _upstream_broke(request, response, sse, exc)
        return response
    finally:
        STREAMS_IN_FLIGHT.dec()
        if completed:
            upstream.release()
        else:  # client gone, cancelled, or upstream broken: drop the upstream connection now
            upstream.close()
    if sse is not None and sse.cut:
        await _end_cut(request, response, sse, "eof")
        return response
    _record_usage(turn, sse, captured)
    return response


def hung_up(request: web.BaseRequest, exc: BaseException) -> bool:
    """Whether `exc` means the client hung up: a reset writing to it, or the cancellation its hang-up causes.

    That cancellation is taken back: the handler goes on to its bookkeeping and returns, so the request
    is recorded, counted and logged. One that comes while the client is still there (shutdown) is not.
    """
    if not isinstance(exc, asyncio.CancelledError):
        return True
    if request.transport is not None and not request.transport.is_closing():
        return False
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    return True


def _record_usage(turn: PreparedTurn | None, sse: SseUsageFilter | None, captured: bytearray | None) -> None:
    """The usage the upstream reported on the way past, to the turn."""
    payloads = sse.payloads if sse is not None else _payload_from_json(captured) if captured else []
    if payloads and turn is not None:
        try:
            turn.record_usage(payloads)
        except Exception:  # the answer is already delivered; a bookkeeping bug must not turn it into a 500
            log.exception("recording usage failed")


async def _copy(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    response: web.StreamResponse,
    sse: SseUsageFilter | None,
    captured: bytearray | None,
    prefix: bytes,
) -> None:
    """The upstream's body to the client as it arrives, through `sse` or kept aside in `captured` (its head)."""
    content = upstream.content  # readany() until b"": what iter_any() yields, without an iterator per read
    first = prefix or await content.readany()
    if not first and sse is not None and sse.watch is not None:
        sse.watch.cut("eof", 0)
        raise UpstreamError("The upstream ended its stream before sending anything.", code="upstream_incomplete")
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
        pending = await content.readany()
    if sse is not None and (rest := sse.finish()):
        await response.write(rest)


async def _upstream_broke(
    request: web.Request, response: web.StreamResponse, sse: SseUsageFilter | None, exc: BaseException
) -> None:
    """Before any byte: a 502/504. After: the error event if the stream was cut, else end (or break) it."""
    watch = sse.watch if sse is not None else None
    cause = "timeout" if isinstance(exc, TimeoutError) else "reset"
    if watch is None:
        log.warning("upstream broke mid-response (%s); ending the client's stream", type(exc).__name__)
    if not response.prepared:
        if sse is not None and watch is not None:
            watch.cut(cause, sse.fed)
        raise _error_before_headers(exc) from exc
    if sse is None or watch is None:
        _break_connection(request)
    elif sse.cut:
        await _end_cut(request, response, sse, cause)
    # else: past its end marker the answer is whole, and the stream ends cleanly


async def _end_cut(request: web.Request, response: web.StreamResponse, sse: SseUsageFilter, cause: str) -> None:
    """Tell the client its stream was cut, in its API's own error event, then end it without a clean end."""
    assert sse.watch is not None
    event = sse.watch.cut(cause, sse.fed)
    if sse.events.unread:  # part of an event past the bound went out: end that event first
        event = b"\n\n" + event
    with contextlib.suppress(ConnectionResetError):
        await response.write(event)
    _break_connection(request)


def _error_before_headers(exc: BaseException) -> UpstreamError:
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamError(
            "The upstream stopped sending before its response began.", status=504, code="upstream_timeout"
        )
    return UpstreamError("The upstream broke off before its response began.", code="upstream_broken")
