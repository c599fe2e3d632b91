"""What a proxy app holds, by typed key: shared by the routes in `server.py` and `rewrite_routes.py`."""

from __future__ import annotations

from aiohttp import web

from proxy.config.loader import ConfigHolder
from proxy.service.seam import ContextService
from proxy.shell.upstream import Upstream

HOLDER = web.AppKey("holder", ConfigHolder)
CONTEXT = web.AppKey("context", ContextService)
UPSTREAM = web.AppKey("upstream", Upstream)
