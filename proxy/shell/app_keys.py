"""What a proxy app holds, by typed key: shared by the routes in `server.py` and `rewrite.py`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from proxy.config.loader import ConfigHolder
from proxy.service.seam import ContextService
from proxy.shell.upstream import Upstream

HOLDER = web.AppKey("holder", ConfigHolder)
CONTEXT = web.AppKey("context", ContextService)
UPSTREAM = web.AppKey("upstream", Upstream)
ENGINE_THREAD = web.AppKey("engine_thread", ThreadPoolExecutor)
PARSES_BODIES = web.AppKey("parses_bodies", bool)
