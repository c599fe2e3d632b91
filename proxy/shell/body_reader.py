"""Reading a client's body: within `server.max_body_mb`, within the proxy-wide `server.body_budget_mb` of
bodies held at once, and with at most `server.body_timeout_s` of silence between the client's bytes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from proxy.config.settings import Settings
from proxy.errors import BodyTooLarge, ErrorShape, ProxyError
from proxy.metrics import METRICS

RETRY_AFTER_S = 1
BUDGET_REFUSALS = METRICS.counter(
    "context_proxy_body_budget_refusals_total", "Requests answered 503 because buffered bodies filled the budget"
)


def max_body(settings: Settings) -> int:
    return int(settings.server.max_body_mb * 1024 * 1024)


def too_large(settings: Settings) -> BodyTooLarge:
    return BodyTooLarge(f"Request body too large: the limit is {settings.server.max_body_mb:g} MB.")


class _ClosingResponse(web.Response):
    """An answer after which the connection closes at once: aiohttp would linger 10 s more for the rest
    of the body (so a client still sending can read an early answer), but this client has gone quiet."""

    async def prepare(self, request: web.BaseRequest) -> Any:
        self._transport = request.transport
        return await super().prepare(request)

    async def write_eof(self, data: bytes = b"") -> None:
        await super().write_eof(data)
        if self._transport is not None:
            self._transport.close()


class BodyTimeout(ProxyError):
    status = 408
    default_code = "request_timeout"

    def response(self, shape: ErrorShape | None = None) -> web.Response:
        answer = super().response(shape)
        return _ClosingResponse(status=answer.status, body=answer.body, content_type="application/json")


def body_timeout(settings: Settings) -> BodyTimeout:
    return BodyTimeout(f"The request body stalled: nothing arrived for {settings.server.body_timeout_s:g} s.")


class BodyBudget:
    """Bytes of request bodies the proxy holds at once, across all requests; past it a request gets 503."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> None:
        if self.held + size > self.limit:
            BUDGET_REFUSALS.inc()
            raise ProxyError(
                "The proxy is holding as many request bodies as it may; retry shortly.",
                status=503,
                code="server_busy",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self.held += size

    def give(self, size: int) -> None:
        self.held -= size


BODY_BUDGET = web.AppKey("body_budget", BodyBudget)


async def chunks(request: web.Request, settings: Settings) -> AsyncIterator[bytes]:
    """The body as it arrives; a client silent for `body_timeout_s` mid-body gets 408."""
    content, timeout = request.content, settings.server.body_timeout_s
    while True:
        chunk = content.read_nowait()  # what has arrived already: no timer to arm (a small body is all here)
        if not chunk and not content.at_eof():
            try:
                async with asyncio.timeout(timeout):
                    chunk = await content.readany()
            except TimeoutError:
                raise body_timeout(settings) from None
        if not chunk:
            return
        yield chunk


@contextlib.asynccontextmanager
async def buffered_body(request: web.Request, settings: Settings) -> AsyncIterator[bytes]:
    """The whole body, counted against the budget until the block ends; refused as soon as it passes the limit."""
    limit, budget = max_body(settings), request.app[BODY_BUDGET]
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(settings)
    held = 0
    try:
        if declared:  # refused before a byte is read when it cannot fit
            budget.take(declared)
            held = declared
        body = bytearray()
        async for chunk in chunks(request, settings):
            body += chunk
            if len(body) > limit:
                raise too_large(settings)
            if len(body) > held:  # chunked (or longer than declared: aiohttp stops at the declared length)
                budget.take(len(body) - held)
                held = len(body)
        yield bytes(body)
    finally:
        budget.give(held)


class StreamedBody:
    """The client's body as it arrives, for the upstream to read; counts it against the limit."""

    def __init__(self, request: web.Request, settings: Settings) -> None:
        self.request, self.settings = request, settings
        self.failure: ProxyError | None = None  # why the body was cut off, for the answer to the client

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total, limit = 0, max_body(self.settings)
        try:
            async for chunk in chunks(self.request, self.settings):
                total += len(chunk)
                if total > limit:
                    raise too_large(self.settings)
                yield chunk
        except ProxyError as exc:
            self.failure = exc
            raise
