"""The aiohttp shell: routes, body limits, the chat path through the engine, everything else verbatim.

Decisions about messages live in the engine behind `ContextService` (proxy/seam.py);
this module only moves bytes and turns failures into OpenAI-shaped errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from multidict import CIMultiDict

from proxy.access import CLIENT_CREDENTIAL, access_middleware, admin_denied, authorization_token, exposure_problem
from proxy.config import ConfigHolder, Settings
from proxy.dialects import CHAT, DIALECTS, Dialect
from proxy.errors import BodyTooLarge, InvalidRequest, ProxyError, UpstreamError, error_response
from proxy.metrics import METRICS
from proxy.relay import read_head, relay
from proxy.seam import BodyParser, ContextService, PassthroughService, PassthroughTurn, PreparedTurn
from proxy.upstream import Upstream

log = logging.getLogger("proxy.server")

HOLDER = web.AppKey("holder", ConfigHolder)
CONTEXT = web.AppKey("context", ContextService)
UPSTREAM = web.AppKey("upstream", Upstream)
ENGINE_THREAD = web.AppKey("engine_thread", ThreadPoolExecutor)
PARSES_BODIES = web.AppKey("parses_bodies", bool)

# Chat bodies at least this large are prepared on the engine's worker thread instead of the event
# loop: a cold 200k-token conversation costs ~80 ms of CPU, much of it in tiktoken, which releases
# the GIL, so other streams keep flowing meanwhile. Smaller bodies stay inline (a thread hop costs more).
OFFLOAD_BYTES = 256 * 1024

RELOAD_INTERVAL_S = 1.0
ERROR_PEEK_BYTES = 64 * 1024  # an upstream 400 is read this far to see if it is a context overflow

REQUESTS = METRICS.counter("context_proxy_requests_total", "Requests by route and status", ["route", "status"])
ENGINE_ERRORS = METRICS.counter(
    "context_proxy_engine_errors_total", "Chat requests forwarded unchanged because the engine failed"
)


def _max_body(settings: Settings) -> int:
    return int(settings.server.max_body_mb * 1024 * 1024)


def _too_large(settings: Settings) -> BodyTooLarge:
    return BodyTooLarge(f"Request body too large: the limit is {settings.server.max_body_mb:g} MB.")


async def read_body(request: web.Request, settings: Settings) -> bytes:
    """The whole body, refused as soon as it passes the limit (declared or counted), never read beyond it."""
    limit = _max_body(settings)
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(settings)
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise _too_large(settings)
    return bytes(body)


class _StreamedBody:
    """The client's body as it arrives, for the upstream to read; counts it against the limit."""

    def __init__(self, request: web.Request, settings: Settings) -> None:
        self.request, self.settings = request, settings
        self.too_large: BodyTooLarge | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total, limit = 0, _max_body(self.settings)
        async for chunk in self.request.content.iter_any():
            total += len(chunk)
            if total > limit:
                self.too_large = _too_large(self.settings)
                raise self.too_large
            yield chunk


def _credential(request: web.Request) -> str:
    """Who the client is, for session scoping: its proxy access key (if any) and its upstream bearer token."""
    proxy_key = request.get(CLIENT_CREDENTIAL)
    token = authorization_token(request.headers)
    return f"{proxy_key}\n{token}" if proxy_key else token


def _upstream_tail(request: web.Request) -> str | None:
    """The raw (still-encoded) path after `/v1/`, or None when it tries to climb out with dot segments."""
    if any(part in (".", "..") for part in request.match_info["tail"].split("/")):
        return None
    raw = request.rel_url.raw_path
    if raw.startswith("/s/"):
        raw = raw[raw.index("/", 3) :]
    return raw[len("/v1/") :]


def _parse_and_prepare(context: Any, parses: bool, dialect: Dialect, raw: bytes, **request: Any) -> Any:
    """Validate the body and let the engine prepare the turn (`parses`: the service parses chat bodies itself)."""
    if parses and dialect is CHAT:
        parsed = context.parse_body(raw, **request)
        return context.prepare(**request, body=parsed.body, digests=parsed.digests)
    body = dialect.parse(raw)
    if dialect is CHAT:  # a service that knows only chat takes the seam's original call
        return context.prepare(**request, body=body)
    return context.prepare(**request, body=body, dialect=dialect)


async def _prepare(request: web.Request, dialect: Dialect, raw: bytes) -> PreparedTurn:
    """The engine's turn; a `ProxyError` (a malformed body, a request that cannot fit) goes to the client."""
    work = functools.partial(
        _parse_and_prepare,
        request.app[CONTEXT],
        request.app[PARSES_BODIES],
        dialect,
        raw,
        path_session=request.match_info.get("session"),
        headers=request.headers,
        credential=_credential(request),
    )
    try:
        if len(raw) >= OFFLOAD_BYTES:  # a big conversation's parse and engine work must not hold other streams
            turn = await asyncio.get_running_loop().run_in_executor(request.app[ENGINE_THREAD], work)
        else:
            turn = work()
    except ProxyError:
        raise
    except Exception as exc:  # an engine bug must not cost the user the answer: forward as sent
        ENGINE_ERRORS.inc()
        log.error("context engine failed (%s); forwarding the request unchanged", type(exc).__name__)
        log.debug("context engine failure", exc_info=True)
        return PassthroughTurn(body=dialect.parse(raw))
    return turn


async def _send(
    request: web.Request, dialect: Dialect, turn: PreparedTurn, raw: bytes
) -> tuple[aiohttp.ClientResponse, bytes]:
    """Send the turn; on a context overflow let the engine refit once, before the client saw a byte."""
    upstream = request.app[UPSTREAM]
    headers = CIMultiDict(request.headers)
    headers["Content-Type"] = "application/json"
    body, retried = turn.body, False
    while True:
        try:
            data = raw if not retried and turn.unchanged else orjson.dumps(body)
        except orjson.JSONEncodeError as exc:  # orjson reads deeper nesting than it writes
            raise InvalidRequest(f"The request body cannot be forwarded: {exc}.", None, "invalid_body") from exc
        response = await upstream.send(
            "POST",
            dialect.upstream_path,
            query_string=request.query_string,
            headers=headers,
            body=data,
            route=dialect.name,
            identity=True,
        )
        if response.status != 400 or retried:
            return response, b""
        try:
            head = await read_head(response, ERROR_PEEK_BYTES)
        except (TimeoutError, aiohttp.ClientError) as exc:
            response.close()
            raise UpstreamError("The upstream broke off its error response.", code="upstream_broken") from exc
        tokens = dialect.overflow_tokens(response.status, head)
        refitted = turn.refit(tokens) if tokens is not None else None
        if refitted is None:
            return response, head
        log.info("upstream reported %d prompt tokens over the window; retrying once re-fitted", tokens)
        response.release()
        body, retried = refitted, True


async def rewrite(request: web.Request, dialect: Dialect) -> web.StreamResponse:
    """A rewritten route (one per dialect): validate, let the engine prepare the turn, forward, relay."""
    raw = await read_body(request, request.app[HOLDER].settings)
    turn = await _prepare(request, dialect, raw)
    await turn.commit()  # a shared session store may re-run the turn on a newer journal here
    response, head = await _send(request, dialect, turn, raw)
    relayed = await relay(request, response, turn=turn, route=dialect.name, prefix=head)
    try:
        await turn.commit()  # its usage (and a refit's journal), before a chunked answer ends
    except Exception:  # the answer is delivered; a bookkeeping failure must not become a 500
        log.exception("writing the turn's usage to the session store failed")
    return relayed


def _rewrite_route(dialect: Dialect) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await rewrite(request, dialect)

    handler.__doc__ = f"POST /v1/{dialect.upstream_path}, rewritten by the engine."
    return handler


_REWRITE_ROUTES = {dialect: _rewrite_route(dialect) for dialect in DIALECTS}
_ROUTE_DIALECTS = {handler: dialect for dialect, handler in _REWRITE_ROUTES.items()}


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Every other /v1/* route: any method, query kept, bodies streamed both ways untouched."""
    settings = request.app[HOLDER].settings
    tail = _upstream_tail(request)
    if tail is None:
        raise InvalidRequest("Dot segments are not allowed in the path.", code="invalid_path")
    if request.content_length is not None and request.content_length > _max_body(settings):
        raise _too_large(settings)
    body = _StreamedBody(request, settings) if request.body_exists else None
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
        if body is not None and body.too_large:  # the upstream saw the body cut off because it was too large
            raise body.too_large from None
        raise
    return await relay(request, response, route="passthrough")


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
    rows = context.sessions_json()
    if rows is None:
        raise ProxyError("This proxy keeps no sessions.", status=404, code="not_found")
    data = rows if session_id is None else context.session_json(session_id)
    if data is None:
        raise ProxyError("No such session.", status=404, code="not_found")
    return web.Response(body=orjson.dumps(data), content_type="application/json")


_ROUTE_LABELS: dict[Callable, str] = {
    **{handler: d.upstream_path.replace("/", "_") for d, handler in _REWRITE_ROUTES.items()},
    passthrough: "passthrough",
    healthz: "healthz",
    metrics: "metrics",
    sessions: "sessions",
}


@web.middleware
async def observe(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Count every request by route and status; answer the proxy's own errors and aiohttp's in OpenAI's shape."""
    label = _ROUTE_LABELS.get(request.match_info.handler, "unmatched")
    status = "499"  # the client went away before an answer
    try:
        response = await handler(request)
        status = str(response.status)
        return response
    except ProxyError as exc:
        status = str(exc.status)
        dialect = _ROUTE_DIALECTS.get(request.match_info.handler)
        return exc.response(dialect.error_body if dialect is not None else None)
    except web.HTTPException as exc:
        status = str(exc.status)
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason, headers={k: v for k, v in exc.headers.items() if k == "Allow"})
    except Exception:
        status = "500"
        raise
    finally:
        REQUESTS.inc(route=label, status=status)


async def _reload_config(holder: ConfigHolder) -> None:
    while True:
        await asyncio.sleep(RELOAD_INTERVAL_S)
        try:
            await asyncio.to_thread(holder.reload_if_changed)
        except Exception:
            log.exception("config reload failed")


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    """The pooled upstream client and the config watcher live exactly as long as the app."""
    await app[UPSTREAM].start()
    watcher = asyncio.create_task(_reload_config(app[HOLDER]))
    yield
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    await app[UPSTREAM].close()
    app[ENGINE_THREAD].shutdown(wait=False)


def create_app(
    holder: ConfigHolder, *, context: ContextService | None = None, upstream: Upstream | None = None
) -> web.Application:
    """The proxy as an aiohttp app; without `context` chat bodies pass unchanged. The app owns `upstream`."""
    app = web.Application(
        middlewares=[observe, access_middleware(holder)], client_max_size=_max_body(holder.settings) + 1
    )
    app[HOLDER] = holder
    app[CONTEXT] = context if context is not None else PassthroughService()
    app[PARSES_BODIES] = isinstance(app[CONTEXT], BodyParser)  # checked once: a Protocol check is slow
    app[UPSTREAM] = upstream if upstream is not None else Upstream(holder)
    # One worker: engine turns on it run one at a time, and each session's lock orders it with the loop.
    app[ENGINE_THREAD] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="context-engine")
    app.cleanup_ctx.append(_lifecycle)
    router = app.router
    for dialect, handler in _REWRITE_ROUTES.items():
        router.add_post(f"/v1/{dialect.upstream_path}", handler)
        router.add_post(f"/s/{{session}}/v1/{dialect.upstream_path}", handler)
    router.add_route("*", "/v1/{tail:.*}", passthrough)
    router.add_route("*", "/s/{session}/v1/{tail:.*}", passthrough)
    router.add_get("/healthz", healthz)
    router.add_get("/metrics", metrics)
    router.add_get("/sessions", sessions)
    router.add_get("/sessions/{session_id}", sessions)
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


async def serve_app(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, int]:
    """Serve an app from `create_app` the way the proxy runs: handlers cancelled on disconnect, paths-only log."""
    runner = web.AppRunner(
        app,
        handler_cancellation=True,  # a client that hangs up cancels its handler, and so its upstream request
        access_log_class=PathAccessLogger,
        access_log=logging.getLogger("proxy.access"),
        shutdown_timeout=1.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, runner.addresses[0][1]


async def _serve_until_stopped(holder: ConfigHolder, host: str, port: int, context: ContextService | None) -> None:
    runner, bound = await start(holder, host, port, context=context)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if problem := exposure_problem(host, holder.settings):
        log.error("%s", problem)
    upstream = holder.settings.upstream.base_url
    log.info("context-proxy listening on http://%s:%d, forwarding to %s", host, bound, upstream)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await runner.cleanup()


def serve(holder: ConfigHolder, host: str, port: int, *, context: ContextService | None = None) -> None:
    """Serve until SIGINT/SIGTERM (the CLI's `serve`)."""
    asyncio.run(_serve_until_stopped(holder, host, port, context))
