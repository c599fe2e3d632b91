"""Which session a Responses `previous_response_id` chain continues, kept in Redis for every instance.

A link is a response id hashed with its credential (`proxy.service.chains.ResponseChains`); its value
the key of the session it was answered in. Links are queued by the turn that relayed the response and
written on its commit, before the answer ends, so the next link finds its session on any instance. Each
expires with the idle TTL: a chain idle longer continues a session Redis has dropped anyway.
"""

from __future__ import annotations

from typing import Any

from proxy.state.redis_keys import chain_key

MAX_QUEUED = 1024  # links waiting for a commit to write them (more, while Redis fails, are dropped)


class ChainLinks:
    def __init__(self, client: Any) -> None:
        self.client = client
        self._queued: dict[str, str] = {}

    def queue(self, link: str, key: str) -> None:
        if len(self._queued) < MAX_QUEUED:
            self._queued[link] = key

    async def write(self, ttl_ms: int) -> None:
        while self._queued:
            link, key = self._queued.popitem()
            await self.client.set(chain_key(link), key, px=ttl_ms)

    async def read(self, link: str) -> str | None:
        key = await self.client.get(chain_key(link))
        return (key.decode() if isinstance(key, bytes) else key) if key else None
