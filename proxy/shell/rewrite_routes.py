"""The rewritten routes: one per API dialect, all through the engine on the same path.

read the body → the engine service parses and prepares the turn (awaited: it places its own work,
off the loop when big, proxy.service.scheduling) → send upstream (re-fitted and retried once on a
context overflow, before the client saw a byte) → relay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web

from proxy.dialects import DIALECTS, Dialect
from proxy.errors import InvalidRequest, ProxyError, UpstreamError
from proxy.metrics import METRICS
from proxy.service.seam import PassthroughTurn, PreparedTurn
from proxy.shell.access import CLIENT_CREDENTIAL, authorization_token
from proxy.shell.app_keys import CONTEXT, HOLDER, UPSTREAM
from proxy.shell.body_reader import buffered_body
from proxy.shell.relay import hung_up, read_head, relay

log = logging.getLogger("proxy.server")

ERROR_PEEK_BYTES = 64 * 1024  # an upstream 400 is read this far to see if it is a context overflow

ENGINE_ERRORS = METRICS.counter(
    "context_proxy_engine_errors_total", "Chat requests forwarded unchanged because the engine failed"
)


def _credential(request: web.Request) -> str:
    """Who the client is, for session scoping: its proxy access key (if any) and its upstream bearer token."""
    proxy_key = request.get(CLIENT_CREDENTIAL)
    token = authorization_token(request.headers) or request.headers.get("x-api-key", "")
    return f"{proxy_key}\n{token}" if proxy_key else token


async def _prepare(request: web.Request, dialect: Dialect, raw: bytes) -> PreparedTurn:
    """The engine's turn; a `ProxyError` (a malformed body, a request that cannot fit) goes to the client."""
    try:
        return await request.app[CONTEXT].prepare_turn(
            raw,
            dialect=dialect,
            path_session=request.match_info.get("session"),
            headers=request.headers,
            credential=_credential(request),
        )
    except ProxyError:
        raise
    except Exception as exc:  # an engine bug must not cost the user the answer: forward as sent
        ENGINE_ERRORS.inc()
        log.error("context engine failed (%s); forwarding the request unchanged", type(exc).__name__)
        log.debug("context engine failure", exc_info=True)
        return PassthroughTurn(body=dialect.parse(raw))


async def _head(response: aiohttp.ClientResponse, dialect: Dialect) -> bytes:
    """What tells whether the upstream refused for length: a 400's body, or a stream's first events.

    A stream is read only while the dialect says it may still turn into a refusal (Responses sends
    `response.created` first); those bytes go to the client afterwards, as they came.
    """
    if response.status == 400:
        return await read_head(response, ERROR_PEEK_BYTES)
    head = b""
    try:
        while len(head) < ERROR_PEEK_BYTES and dialect.stream_undecided(head):
            chunk = await response.content.readany()
            if not chunk:
                break
            head += chunk
    except (TimeoutError, aiohttp.ClientError):
        pass  # a stream broken this early: the relay meets the same error and ends the client's stream as cut
    return head


async def _send(
    request: web.Request, dialect: Dialect, turn: PreparedTurn, raw: bytes
) -> tuple[aiohttp.ClientResponse, bytes]:
    """Send the turn; on a context overflow let the engine refit once, before the client saw a byte."""
    upstream = request.app[UPSTREAM]
    body, retried = turn.body, False
    while True:
        try:
            # The client's own bytes, those the service made (a warm turn's: the last body's and its new), or ours.
            made = None if retried else raw if turn.unchanged else turn.data
            data = made or orjson.dumps(body)
        except orjson.JSONEncodeError as exc:  # orjson reads deeper nesting than it writes
            raise InvalidRequest(f"The request body cannot be forwarded: {exc}.", None, "invalid_body") from exc
        response = await upstream.send(
            "POST",
            dialect.upstream_path,
            query_string=request.query_string,
            headers=request.headers,
            body=data,
            route=dialect.name,
            identity=True,
            content_type="application/json",
        )
        refusal = response.status == 400 or (response.status == 200 and response.content_type == "text/event-stream")
        if not refusal or retried:
            return response, b""
        try:
            head = await _head(response, dialect)
        except (TimeoutError, aiohttp.ClientError) as exc:
            response.close()
            raise UpstreamError("The upstream broke off its response.", code="upstream_broken") from exc
        tokens = dialect.overflow_tokens(response.status, head)
        refitted = await turn.refit(tokens) if tokens is not None else None
        if refitted is None:
            return response, head
        log.info("upstream reported %d prompt tokens over the window; retrying once re-fitted", tokens)
        response.release()
        body, retried = refitted, True


async def rewrite(request: web.Request, dialect: Dialect) -> web.StreamResponse:
    """A rewritten route (one per dialect): validate, let the engine prepare the turn, forward, relay."""
    async with buffered_body(request, request.app[HOLDER].settings) as raw:  # held against the budget until sent
        turn = await _prepare(request, dialect, raw)
        if turn.commits:
            await turn.commit()  # a shared session store may re-run the turn on a newer journal here
        response, head = await _send(request, dialect, turn, raw)
    relayed = await relay(request, response, turn=turn, route=dialect.name, prefix=head, api=dialect.name)
    if not turn.commits:  # nothing to share: no task to shield it from the client's hang-up
        return relayed
    try:  # its usage (and a refit's journal), before a chunked answer ends; a client gone meanwhile cannot stop it
        await asyncio.shield(turn.commit())
    except asyncio.CancelledError as exc:
        if not hung_up(request, exc):
            raise
    except Exception:  # the answer is delivered; a bookkeeping failure must not become a 500
        log.exception("writing the turn's usage to the session store failed")
    return relayed


def _rewrite_route(dialect: Dialect) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await rewrite(request, dialect)

    handler.__doc__ = f"POST /v1/{dialect.upstream_path}, rewritten by the engine."
    return handler


REWRITE_ROUTES = {dialect: _rewrite_route(dialect) for dialect in DIALECTS}
ROUTE_DIALECTS = {handler: dialect for dialect, handler in REWRITE_ROUTES.items()}
