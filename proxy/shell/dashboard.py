"""What the proxy saved: `GET /stats`, the totals over every session `/sessions` lists."""

from __future__ import annotations

import orjson
from aiohttp import web

from proxy import __version__
from proxy.errors import ProxyError
from proxy.service.seam import ContextService
from proxy.shell.access import admin_denied
from proxy.shell.app_keys import CONTEXT, HOLDER
from proxy.state.sessions import totals


async def stats(request: web.Request) -> web.Response:
    """`GET /stats`: the totals over the sessions `/sessions` lists (`proxy.state.sessions.totals`)."""
    if denied := admin_denied(request, request.app[HOLDER].settings):
        return denied
    context: ContextService = request.app[CONTEXT]
    rows = await context.sessions_json()
    if rows is None:
        raise ProxyError("This proxy keeps no sessions.", status=404, code="not_found")
    body = {"version": __version__, "totals": totals(rows)}
    return web.Response(body=orjson.dumps(body), content_type="application/json", headers={"Cache-Control": "no-store"})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/stats", stats)


ROUTE_LABELS = {stats: "stats"}
