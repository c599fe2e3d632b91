"""The floor for any Python proxy: a bare aiohttp relay that forwards bytes both ways and decides nothing.

`python -m bench.relay --upstream http://127.0.0.1:PORT` (the upstream's origin, no /v1).
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}
)


def create_relay_app(upstream: str) -> web.Application:
    """Forward every request to `upstream` + the same path; stream the answer back as it arrives."""

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        async with app[SESSION].request(request.method, upstream + request.path_qs, headers=headers, data=body) as up:
            response = web.StreamResponse(status=up.status, reason=up.reason)
            response.headers.update({k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP})
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def session(app: web.Application):
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as client:
            app[SESSION] = client
            yield

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app
