"""Codex's WebSocket mode relayed: idle and dead sockets are closed, a message may be as large as an HTTP body, and
the client only ever gets a close code an endpoint may send.

The upstream is a real aiohttp WebSocket server on loopback; the client is aiohttp's WebSocket client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.harness import Rig, start_rig

WS_PATH = "/v1/responses"


class Upstream:
    """`/v1/responses` upgraded: echoes each message's type and size (`?drop=1`: drops the connection without a
    close frame on the first message); counts the sockets still open."""

    def __init__(self) -> None:
        self.open = 0
        self.runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        socket = web.WebSocketResponse(autoping=True, max_msg_size=0)
        await socket.prepare(request)
        self.open += 1
        try:
            async for message in socket:
                if request.query.get("drop"):
                    assert request.transport is not None
                    request.transport.abort()  # gone: no close frame
                    break
                await socket.send_str(f"{message.type.name} {len(message.data)}")
        finally:
            self.open -= 1
        return socket

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get(WS_PATH, self.handle)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server = Upstream()
    await server.start()
    yield server
    assert server.runner is not None
    await server.runner.cleanup()


@pytest.fixture
async def make_rig(upstream: Upstream) -> AsyncIterator[Any]:
    rigs: list[Rig] = []

    async def make(**server: Any) -> Rig:
        assert upstream.runner is not None
        url = f"http://127.0.0.1:{upstream.runner.addresses[0][1]}/v1"
        rigs.append(await start_rig(upstream_url=url, server=server))
        return rigs[-1]

    yield make
    for rig in rigs:
        await rig.close()


async def _closed(socket: aiohttp.ClientWebSocketResponse, within_s: float = 15) -> aiohttp.WSMessage:
    """The close the proxy sent (pings skipped); a socket still open after `within_s` fails the test."""
    while True:
        message = await socket.receive(timeout=within_s)
        if message.type not in (aiohttp.WSMsgType.PING, aiohttp.WSMsgType.PONG):
            return message


async def test_idle_sockets_are_closed_and_a_new_client_gets_through(make_rig: Any, upstream: Upstream) -> None:
    """Every connection slot held by an idle WebSocket: without an idle timeout, every new client gets 503."""
    slots = 6
    rig = await make_rig(max_connections=slots, websocket_idle_timeout_s=1, websocket_heartbeat_s=30)
    async with aiohttp.ClientSession() as http:
        sockets = [await http.ws_connect(rig.root + WS_PATH) for _ in range(slots)]
        assert upstream.open == slots
        closes = [await _closed(socket) for socket in sockets]
        assert [(c.type, c.data) for c in closes] == [(aiohttp.WSMsgType.CLOSE, 1001)] * slots
        for _ in range(100):
            if not upstream.open:
                break
            await asyncio.sleep(0.05)
        assert upstream.open == 0
        async with aiohttp.ClientSession() as fresh, fresh.get(rig.root + "/healthz") as response:
            assert response.status == 200  # a free slot, not a 503
        for socket in sockets:
            await socket.close()


async def test_a_client_that_stops_answering_pings_is_closed_with_its_upstream(
    make_rig: Any, upstream: Upstream
) -> None:
    """A peer gone silently (no FIN: a laptop closed) keeps its socket until a heartbeat finds it."""
    rig = await make_rig(websocket_heartbeat_s=0.5, websocket_idle_timeout_s=600)
    async with aiohttp.ClientSession() as http:
        socket = await http.ws_connect(rig.root + WS_PATH, autoping=False)  # never answers the proxy's pings
        assert upstream.open == 1
        for _ in range(200):
            if not upstream.open:
                break
            await asyncio.sleep(0.05)
        assert upstream.open == 0, "the relay kept a socket whose client stopped answering"
        await socket.close()


async def test_a_client_message_as_large_as_an_http_body_is_relayed(make_rig: Any) -> None:
    """aiohttp's default closes a socket on a message over 4 MB (1009) where the HTTP route takes 32 MB."""
    rig = await make_rig(max_body_mb=32)
    async with aiohttp.ClientSession() as http, http.ws_connect(rig.root + WS_PATH, max_msg_size=0) as socket:
        big = "x" * (6 * 1024 * 1024)
        await socket.send_str(big)
        answer = await socket.receive(timeout=30)
        assert (answer.type, answer.data) == (aiohttp.WSMsgType.TEXT, f"TEXT {len(big)}")


async def test_an_upstream_gone_without_a_close_frame_closes_the_client_with_1011(make_rig: Any) -> None:
    """1006 reports a connection lost without a close frame; RFC 6455 forbids sending it in one."""
    rig = await make_rig()
    async with aiohttp.ClientSession() as http, http.ws_connect(rig.root + WS_PATH + "?drop=1") as socket:
        await socket.send_str('{"type": "response.create"}')
        close = await _closed(socket)
        assert (close.type, close.data) == (aiohttp.WSMsgType.CLOSE, aiohttp.WSCloseCode.INTERNAL_ERROR)
