"""The aiohttp shell: routes, body limits, the chat path through the engine, everything else verbatim.

Decisions about messages live in the engine behind `ContextService` (proxy/service/seam.py);
this module only moves bytes and turns failures into OpenAI-shaped errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from proxy.config.loader import ConfigHolder
from proxy.dialects import MESSAGES
from proxy.errors import ErrorShape, InvalidRequest, ProxyError, UpstreamError
from proxy.metrics import METRICS
from proxy.service.seam import ContextService, PassthroughService
from proxy.shell import dashboard
from proxy.shell.access import (
    AccessMiddleware,
    Handler,
    admin_denied,
    exposure_problem,
)
from proxy.shell.app_keys import CONTEXT, HOLDER, UPSTREAM
from proxy.shell.body_reader import BODY_BUDGET, BodyBudget, StreamedBody, max_body, too_large
from proxy.shell.connection_guard import ConnectionGuard, GuardedSite, raise_file_limit
from proxy.shell.log_hygiene import AcceptFailures, guarded_logger
from proxy.shell.relay import hung_up, relay
from proxy.shell.rewrite_routes import REWRITE_ROUTES, ROUTE_DIALECTS
from proxy.shell.stream_ends import api_for_path
from proxy.shell.upstream import Upstream, is_anthropic
from proxy.shell.websocket_relay import is_websocket, websocket

log = logging.getLogger("proxy.server")


RELOAD_INTERVAL_S = 1.0
REQUESTS = METRICS.counter("context_proxy_requests_total", "Requests by route and status", ["route", "status"])
# Each request's series, looked up once per route and status (both few: route labels, HTTP statuses).
_requests = functools.lru_cache(maxsize=512)(lambda route, status: REQUESTS.labels(route=route, status=status))


def _upstream_tail(request: web.Request) -> str | None:
    """The raw (still-encoded) path after `/v1/`, or None when it tries to climb out with dot segments."""
    if any(part in (".", "..") for part in request.match_info["tail"].split("/")):
        return None
    raw = request.rel_url.raw_path
    if raw.startswith("/s/"):
        raw = raw[raw.index("/", 3) :]
    return raw[len("/v1/") :]


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Every other /v1/* route: any method, query kept, bodies streamed both ways untouched."""
    settings = request.app[HOLDER].settings
    tail = _upstream_tail(request)
    if tail is None:
        raise InvalidRequest("Dot segments are not allowed in the path.", code="invalid_path")
    if is_websocket(request):  # Codex's WebSocket mode: relayed message by message, unedited
        return await websocket(request, tail)
    if request.content_length is not None and request.content_length > max_body(settings):
        raise too_large(settings)
    body = StreamedBody(request, settings) if request.body_exists else None
    # aiohttp decodes a compressed body as it reads it: that goes on decoded, its length unknown.
    length = None if "Content-Encoding" in request.headers else request.content_length
    try:
        response = await request.app[UPSTREAM].send(
            request.method,
            tail,
            query_string=request.rel_url.raw_query_string,
            headers=request.headers,
            body=body.__aiter__() if body is not None else None,
            content_length=length,
            route="passthrough",
        )
    except UpstreamError:
        if body is not None and body.failure:  # the upstream saw the body cut off: too large, or stalled
            raise body.failure from None
        raise
    return await relay(request, response, route="passthrough", api=api_for_path(request.method, tail))


async def healthz(request: web.Request) -> web.Response:
    holder = request.app[HOLDER]
    state_problem = request.app[CONTEXT].state_problem()
    status = {
        "status": "ok",
        "config_error": holder.last_error,
        "state": "degraded" if state_problem else "ok",
        "state_error": state_problem,
    }
    return web.Response(body=orjson.dumps(status), content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    if denied := admin_denied(request, request.app[HOLDER].settings):
        return denied
    body = METRICS.render().encode()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def sessions(request: web.Request) -> web.Response:
    if denied := admin_denied(request, request.app[HOLDER].settings):
        return denied
    context: ContextService = request.app[CONTEXT]
    session_id = request.match_info.get("session_id")
    data: list[dict[str, Any]] | dict[str, Any] | None
    if session_id is None:
        data = await context.sessions_json()
        if data is None:
            raise ProxyError("This proxy keeps no sessions.", status=404, code="not_found")
    elif (data := await context.session_json(session_id)) is None:
        raise ProxyError("No such session.", status=404, code="not_found")
    return web.Response(body=orjson.dumps(data), content_type="application/json")


_ROUTE_LABELS: dict[Callable, str] = {
    **{handler: d.upstream_path.replace("/", "_") for d, handler in REWRITE_ROUTES.items()},
    passthrough: "passthrough",
    healthz: "healthz",
    metrics: "metrics",
    sessions: "sessions",
    **dashboard.ROUTE_LABELS,
}


class Observe:
    """Count every request by route and status; answer the proxy's own errors and aiohttp's in the API's shape.

    A callable object rather than a `@web.middleware` function: aiohttp 3 reads the marker below,
    aiohttp 4 takes any such callable (and deprecates the decorator).
    """

    __middleware_version__ = 1

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        return await _observed(request, handler)


async def _observed(request: web.Request, handler: Handler) -> web.StreamResponse:
    label = _ROUTE_LABELS.get(request.match_info.handler, "unmatched")
    status = "499"  # the client went away before an answer
    try:
        response = await handler(request)
        status = str(response.status)
        return response
    except ProxyError as exc:
        status = str(exc.status)
        return exc.response(_error_shape(request))
    except web.HTTPException as exc:
        status = str(exc.status)
        if exc.status < 400:
            raise
        allow = {k: v for k, v in exc.headers.items() if k == "Allow"}
        return ProxyError(exc.reason, status=exc.status, headers=allow).response(_error_shape(request))
    except asyncio.CancelledError as exc:
        if not hung_up(request, exc):
            raise
        return web.Response(status=499)  # never sent: what the access log records for a client gone before its answer
    except Exception:
        status = "500"
        raise
    finally:
        _requests(label, status).inc()


def _error_shape(request: web.Request) -> ErrorShape | None:
    """The route's API's error shape: its dialect's, Anthropic's for any request for Anthropic; else OpenAI's."""
    dialect = ROUTE_DIALECTS.get(request.match_info.handler)
    if dialect is None and is_anthropic(request.match_info.get("tail", ""), request.headers):
        dialect = MESSAGES
    return dialect.error_body if dialect is not None else None


async def _reload_config(holder: ConfigHolder) -> None:
    failing = ""  # the same failure each second (out of descriptors, say) is logged once, not every time
    while True:
        await asyncio.sleep(RELOAD_INTERVAL_S)
        try:
            await asyncio.to_thread(holder.reload_if_changed)
            failing = ""
        except Exception as exc:
            if repr(exc) != failing:
                log.exception("config reload failed")
            failing = repr(exc)


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    """The pooled upstream client and the config watcher live exactly as long as the app."""
    await app[UPSTREAM].start()
    watcher = asyncio.create_task(_reload_config(app[HOLDER]))
    yield
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    await app[UPSTREAM].close()


def create_app(
    holder: ConfigHolder, *, context: ContextService | None = None, upstream: Upstream | None = None
) -> web.Application:
    """The proxy as an aiohttp app; without `context` chat bodies pass unchanged. The app owns `upstream`."""
    app = web.Application(
        middlewares=[Observe(), AccessMiddleware(holder)], client_max_size=max_body(holder.settings) + 1
    )
    app[HOLDER] = holder
    app[CONTEXT] = context if context is not None else PassthroughService()
    app[UPSTREAM] = upstream if upstream is not None else Upstream(holder)
    # Never below one body of the largest size allowed, or such a body would be refused for good.
    app[BODY_BUDGET] = BodyBudget(
        max(int(holder.settings.server.body_budget_mb * 1024 * 1024), max_body(holder.settings))
    )
    app.cleanup_ctx.append(_lifecycle)
    router = app.router
    for dialect, handler in REWRITE_ROUTES.items():
        router.add_post(f"/v1/{dialect.upstream_path}", handler)
        router.add_post(f"/s/{{session}}/v1/{dialect.upstream_path}", handler)
    router.add_route("*", "/v1/{tail:.*}", passthrough)
    router.add_route("*", "/s/{session}/v1/{tail:.*}", passthrough)
    router.add_get("/healthz", healthz)
    router.add_get("/metrics", metrics)
    router.add_get("/sessions", sessions)
    router.add_get("/sessions/{session_id}", sessions)
    dashboard.add_routes(router)
    return app


class PathAccessLogger(AbstractAccessLogger):
    """One line per request without the query string (it may carry a key) and without headers."""

    @property
    def enabled(self) -> bool:
        """aiohttp skips `log` (and its timing) on connections opened while INFO is off."""
        return self.logger.isEnabledFor(logging.INFO)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info("%s %s %s %s %.3fs", request.remote, request.method, request.path, response.status, time)


async def start(
    holder: ConfigHolder,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    context: ContextService | None = None,
    upstream: Upstream | None = None,
) -> tuple[web.AppRunner, int]:
    """Serve the proxy in the running loop; returns the runner (`await runner.cleanup()`) and the bound port."""
    return await serve_app(create_app(holder, context=context, upstream=upstream), host, port)


async def serve_app(
    app: web.Application, host: str = "127.0.0.1", port: int = 0, *, reuse_port: bool = False
) -> tuple[web.AppRunner, int]:
    """Serve an app from `create_app` the way the proxy runs: handlers cancelled on disconnect, paths-only log,
    connections limited and timed (shell/connection_guard.py); `reuse_port`: one of several workers on the port."""
    server = app[HOLDER].settings.server
    runner = web.AppRunner(
        app,
        handler_cancellation=True,  # a client that hangs up cancels its handler, and so its upstream request
        access_log_class=PathAccessLogger,
        access_log=guarded_logger("proxy.access"),
        logger=guarded_logger("proxy.http"),  # aiohttp's protocol errors, without the client's bytes
        keepalive_timeout=server.keepalive_timeout_s,
        shutdown_timeout=1.0,
    )
    await runner.setup()
    try:
        guard = ConnectionGuard(server.max_connections, server.header_timeout_s)
        await GuardedSite(runner, host, port, guard, reuse_port=reuse_port).start()
    except OSError as exc:  # port taken, address not ours, host unknown: one line, nothing left open
        await runner.cleanup()
        reason = (exc.strerror or str(exc)).rsplit(": ", 1)[-1]
        raise ListenError(f"cannot listen on {host}:{port}: {reason}") from exc
    return runner, runner.addresses[0][1]


class ListenError(OSError):
    """The address to serve on cannot be bound."""


async def _serve_until_stopped(
    holder: ConfigHolder, host: str, port: int, context: ContextService | None, reuse_port: bool
) -> None:
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(AcceptFailures(loop))  # out of descriptors: one line per interval, with a count
    raise_file_limit(holder.settings.server.max_connections)
    runner, bound = await serve_app(create_app(holder, context=context), host, port, reuse_port=reuse_port)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if problem := exposure_problem(host, holder.settings):
        log.error("%s", problem)
    upstream, anthropic = holder.settings.upstream.base_url, holder.settings.anthropic.base_url
    log.info(
        "context-proxy listening on http://%s:%d, forwarding to %s (Anthropic: %s)", host, bound, upstream, anthropic
    )
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await runner.cleanup()


def serve(
    holder: ConfigHolder, host: str, port: int, *, context: ContextService | None = None, reuse_port: bool = False
) -> None:
    """Serve until SIGINT/SIGTERM (the CLI's `serve`; `reuse_port`: one of several workers on the port)."""
    asyncio.run(_serve_until_stopped(holder, host, port, context, reuse_port))
