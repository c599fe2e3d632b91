"""Codex's WebSocket mode (`GET /v1/responses` with `Upgrade: websocket`), proxied message by message, unedited.

In that mode Codex sends only the new input against the state the upstream keeps for the
connection, so there is nothing for the engine to fit: both directions are relayed as they come.
The savings are in HTTP mode (README: the Codex setting that keeps it).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import web

from proxy.metrics import METRICS
from proxy.shell.app_keys import UPSTREAM

log = logging.getLogger("proxy.websocket")

WEBSOCKETS = METRICS.counter("context_proxy_websockets_total", "WebSocket connections proxied unedited", ["path"])


def is_websocket(request: web.BaseRequest) -> bool:
    return request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket"


Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse


async def _pump(source: Socket, sink: Socket) -> None:
    """Every message from `source` to `sink` as it came (text as text, binary as binary) until either closes."""
    async for message in source:
        if message.type == aiohttp.WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type == aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        else:
            break


async def websocket(request: web.Request, tail: str) -> web.StreamResponse:
    """Open the upstream's WebSocket first (a refusal is answered as HTTP), then relay both ways."""
    upstream = await request.app[UPSTREAM].websocket(
        tail, query_string=request.rel_url.raw_query_string, headers=request.headers
    )
    client = web.WebSocketResponse(protocols=(upstream.protocol,) if upstream.protocol else (), autoping=True)
    WEBSOCKETS.inc(path=tail)
    try:
        await client.prepare(request)
        pumps = [asyncio.ensure_future(_pump(client, upstream)), asyncio.ensure_future(_pump(upstream, client))]
        done, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in done:
            if task.exception() is not None:  # one side went away mid-send: the other is closed below
                log.info("websocket relay ended: %s", type(task.exception()).__name__)
    finally:
        await upstream.close()
        await client.close(code=upstream.close_code or aiohttp.WSCloseCode.OK)
    return client
