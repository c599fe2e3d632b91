"""Codex's WebSocket mode (`GET /v1/responses` with `Upgrade: websocket`), proxied message by message, unedited.

In that mode Codex sends only the new input against the state the upstream keeps for the
connection, so there is nothing for the engine to fit: both directions are relayed as they come.
The savings are in HTTP mode (README: the Codex setting that keeps it).

Each side is pinged every `server.websocket_heartbeat_s` (a dead peer is closed when its pong is late), both
are closed after `websocket_idle_timeout_s` with no message either way (an idle socket would hold its
connection slot forever), a client message may be as large as an HTTP body (`max_body_mb`), and the client
only ever gets a close code RFC 6455 lets an endpoint send.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web

from proxy.metrics import METRICS
from proxy.shell.app_keys import HOLDER, UPSTREAM

log = logging.getLogger("proxy.websocket")

WEBSOCKETS = METRICS.counter("context_proxy_websockets_total", "WebSocket connections proxied unedited", ["path"])


def is_websocket(request: web.BaseRequest) -> bool:
    return request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket"


Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse
MIB = 1024 * 1024
IDLE = aiohttp.WSCloseCode.GOING_AWAY  # what both sides get when the idle timeout closes them
# RFC 6455 7.4.1: 1005, 1006 and 1015 only report what happened, never go in a close frame; 1004 is reserved.
_SENDABLE = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014})


def client_close_code(upstream_code: int | None) -> int:
    """What the client is closed with after the upstream's end: its own code when an endpoint may send it, 1000
    for a close frame without one, else (gone without a close frame: aiohttp's 1006) 1011."""
    if upstream_code == 1005:  # a close frame that named no code
        return aiohttp.WSCloseCode.OK
    if upstream_code is not None and (upstream_code in _SENDABLE or 3000 <= upstream_code <= 4999):
        return upstream_code
    return aiohttp.WSCloseCode.INTERNAL_ERROR


async def _pump(source: Socket, sink: Socket, heard: Callable[[], None]) -> None:
    """Every message from `source` to `sink` as it came (text as text, binary as binary) until either closes."""
    async for message in source:
        heard()
        if message.type == aiohttp.WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type == aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        else:
            break


class _Idle:
    """When the last message went either way; `wait()` returns once none has for `timeout_s`."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.last = time.monotonic()

    def heard(self) -> None:
        self.last = time.monotonic()

    async def wait(self) -> None:
        while (left := self.last + self.timeout_s - time.monotonic()) > 0:
            await asyncio.sleep(left)


async def websocket(request: web.Request, tail: str) -> web.StreamResponse:
    """Open the upstream's WebSocket first (a refusal is answered as HTTP), then relay both ways."""
    server = request.app[HOLDER].settings.server
    upstream = await request.app[UPSTREAM].websocket(
        tail, query_string=request.rel_url.raw_query_string, headers=request.headers
    )
    client = web.WebSocketResponse(
        protocols=(upstream.protocol,) if upstream.protocol else (),
        autoping=True,
        heartbeat=server.websocket_heartbeat_s,
        max_msg_size=int(server.max_body_mb * MIB),  # what the HTTP route takes, not aiohttp's 4 MB
    )
    WEBSOCKETS.inc(path=tail)
    idle = _Idle(server.websocket_idle_timeout_s)
    idled = False
    try:
        await client.prepare(request)
        pumps = [_pump(client, upstream, idle.heard), _pump(upstream, client, idle.heard), idle.wait()]
        tasks = [asyncio.ensure_future(pump) for pump in pumps]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        idled = tasks[2] in done
        for task in done:
            if task.exception() is not None:  # one side went away mid-send: the other is closed below
                log.info("websocket relay ended: %s", type(task.exception()).__name__)
    finally:
        await upstream.close(code=IDLE if idled else aiohttp.WSCloseCode.OK)
        await client.close(code=IDLE if idled else client_close_code(upstream.close_code))
    return client
