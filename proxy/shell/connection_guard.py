"""Client connections: how many at once, and how long one may take to send its request head.

aiohttp's server closes a connection idle between requests (`keepalive_timeout`, also armed when
the connection opens) but has no limit on connections and no deadline for a head that arrives a
byte at a time. `ConnectionGuard` wraps each of aiohttp's protocol objects: past
`server.max_connections` a new connection gets a 503 in OpenAI's shape and is closed before it is
read; a request head not complete `server.header_timeout_s` after its first byte closes the
connection. Body reads have their own timeout, where bodies are read (`proxy.shell.body_reader`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from proxy.errors import error_body
from proxy.metrics import METRICS

log = logging.getLogger("proxy.server")

CLOSED = METRICS.counter(
    "context_proxy_connections_closed_total", "Client connections the proxy closed itself, by reason", ["reason"]
)
OPEN = METRICS.gauge("context_proxy_connections_open", "Client connections open now")
RETRY_AFTER_S = 1
# Descriptors beyond two per connection (client + upstream): listeners, the state file, the loop's own.
SPARE_FILES = 256


def _busy_response() -> bytes:
    body = error_body("The proxy has too many open connections; retry shortly.", 503, "too_many_connections")
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Retry-After: {RETRY_AFTER_S}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


BUSY_RESPONSE = _busy_response()


class ConnectionGuard:
    """Counts the connections it admits; makes the protocol factory `loop.create_server` is given."""

    def __init__(self, max_connections: int, header_timeout_s: float) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.open = 0

    def factory(self, server: web.Server) -> Callable[[], asyncio.Protocol]:
        return lambda: GuardedConnection(server(), self)


class GuardedConnection(asyncio.Protocol):
    """aiohttp's protocol for one connection, admitted (or refused) and timed by the guard."""

    def __init__(self, inner: RequestHandler, guard: ConnectionGuard) -> None:
        self.inner, self.guard = inner, guard
        self.admitted = False
        self.head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.guard.open >= self.guard.max_connections:
            CLOSED.inc(reason="max_connections")
            transport.write(BUSY_RESPONSE)  # type: ignore[attr-defined]
            transport.close()
            return
        self.admitted = True
        self.guard.open += 1
        OPEN.set(self.guard.open)
        self.inner.connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.admitted:
            return
        self.admitted = False
        self.guard.open -= 1
        OPEN.set(self.guard.open)
        self._stop_head_timer()
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        starts_head = self.head_timer is None and self._awaiting_head()  # the first bytes of a request head
        self.inner.data_received(data)
        if self.head_timer is not None:
            if not self._awaiting_head():  # the head is complete
                self._stop_head_timer()
        elif starts_head and self._awaiting_head():  # and not complete in them: the rest is timed (one whole
            loop = asyncio.get_running_loop()  # in its first bytes, as most are, needs no timer)
            self.head_timer = loop.call_later(self.guard.header_timeout_s, self._head_expired)

    def eof_received(self) -> None:
        if self.admitted:
            self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def _awaiting_head(self) -> bool:
        """aiohttp's request loop waits on `_waiter` exactly while no complete request head is queued."""
        waiter = self.inner._waiter
        return waiter is not None and not waiter.done()

    def _head_expired(self) -> None:
        self.head_timer = None
        if self.admitted and self._awaiting_head():
            CLOSED.inc(reason="header_timeout")
            self.inner.force_close()

    def _stop_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None


class GuardedSite(web.TCPSite):
    """aiohttp's TCP site, serving each connection through the guard."""

    def __init__(
        self, runner: web.AppRunner, host: str, port: int, guard: ConnectionGuard, *, reuse_port: bool = False
    ) -> None:
        super().__init__(runner, host, port, reuse_port=reuse_port or None)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self.guard.factory(server), self._host, self._port, backlog=self._backlog, reuse_port=self._reuse_port
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]


def raise_file_limit(max_connections: int) -> None:
    """Lift the soft descriptor limit toward what `max_connections` needs; say so when the hard limit is lower."""
    wanted = 2 * max_connections + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "the file limit (%d) is below what server.max_connections = %d needs (%d): lower it or raise the limit",
            soft,
            max_connections,
            wanted,
        )
