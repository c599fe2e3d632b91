"""What the proxy saved: `GET /stats` (the totals over every session `/sessions` lists) and `GET /dashboard`.

The dashboard is one page served from the package (`proxy/data/dashboard/`: its HTML, script and style,
nothing fetched from elsewhere, so it works offline) that polls `/stats`, `/sessions` and `/sessions/{id}`.
It sits behind the admin token like those routes. A browser cannot send a Bearer header on navigation, so
it opens `/dashboard?token=TOKEN` once: the token becomes an HttpOnly, SameSite=Strict cookie and the
browser is sent on to `/dashboard`, the token gone from its address bar and history. The access log writes
paths only, so the token is in no log line.
"""

from __future__ import annotations

import importlib.resources
from functools import cache

import orjson
from aiohttp import web

from proxy import __version__
from proxy.config.settings import Settings
from proxy.errors import ProxyError
from proxy.service.seam import ContextService
from proxy.shell.access import ADMIN_COOKIE, admin_denied, admin_token, is_admin_token
from proxy.shell.app_keys import CONTEXT, HOLDER
from proxy.state.sessions import totals

ASSETS = {
    "": ("index.html", "text/html"),
    "dashboard.js": ("dashboard.js", "text/javascript"),
    "dashboard.css": ("dashboard.css", "text/css"),
    "favicon.svg": ("favicon.svg", "image/svg+xml"),
}
# The page runs only its own script and style, reaches only this proxy, and may not be framed: even a
# string the page failed to escape could not run, load or send anything.
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": POLICY,
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
DENIED = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>context-proxy dashboard</title></head>
<body><h1>context-proxy dashboard</h1><p>{}</p></body></html>
"""
NEEDS_TOKEN = (
    "This page needs the proxy's admin token (the variable [server] admin_token_env names). Open "
    "<code>/dashboard?token=YOUR_TOKEN</code> once: this browser keeps it as a cookie until it closes."
)
LOOPBACK_ONLY = (
    "This page is only served to loopback clients. To open it from elsewhere, set [server] admin_token_env "
    "to a variable holding a token and open <code>/dashboard?token=YOUR_TOKEN</code>."
)


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


async def root(request: web.Request) -> web.Response:
    """`GET /`: the dashboard (a `?token=` goes along)."""
    query = request.rel_url.raw_query_string
    return _see_other("/dashboard" + (f"?{query}" if query else ""))


async def dashboard(request: web.Request) -> web.Response:
    """`GET /dashboard` and its files (script, style, icon); `?token=` signs the browser in."""
    settings = request.app[HOLDER].settings
    if "token" in request.query:
        return _sign_in(request, settings)
    if admin_denied(request, settings) is not None:
        loopback_only = admin_token(settings) is None
        return _page(DENIED.format(LOOPBACK_ONLY if loopback_only else NEEDS_TOKEN), 403 if loopback_only else 401)
    name, content_type = ASSETS[request.match_info.get("asset", "")]
    return web.Response(body=_asset(name), content_type=content_type, charset="utf-8", headers=PAGE_HEADERS)


def _sign_in(request: web.Request, settings: Settings) -> web.Response:
    """The token checked and kept as the admin cookie, the browser sent on to the page without it in the URL."""
    presented = request.query["token"]
    if admin_token(settings) is None:  # no token in force: loopback clients only, nothing to keep
        return _see_other("/dashboard")
    if not is_admin_token(presented, settings):
        return _page(DENIED.format("That is not the proxy's admin token. " + NEEDS_TOKEN), 401)
    response = _see_other("/dashboard")
    response.set_cookie(ADMIN_COOKIE, presented, path="/", httponly=True, samesite="Strict", secure=request.secure)
    return response


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


def _page(html: str, status: int) -> web.Response:
    return web.Response(text=html, status=status, content_type="text/html", headers=PAGE_HEADERS)


@cache
def _asset(name: str) -> bytes:
    return importlib.resources.files("proxy").joinpath("data", "dashboard", name).read_bytes()


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/stats", stats)
    router.add_get("/", root)
    router.add_get("/dashboard", dashboard)
    router.add_get("/dashboard/{asset:dashboard\\.(?:js|css)|favicon\\.svg}", dashboard)


ROUTE_LABELS = {stats: "stats", root: "dashboard", dashboard: "dashboard"}
