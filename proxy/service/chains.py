"""Responses chained by `previous_response_id`: one session, and the usage of the turns forwarded unedited.

A request naming `previous_response_id` carries only its new input (the history lives on the
server), so nothing in it says which session it continues. The id of every response the proxy
relayed is remembered with its session's key, so the next link of the chain lands in that
session; a link forwarded unedited still records what the upstream billed for it.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.context.policy import ModelInfo
from proxy.dialects import Dialect
from proxy.state import SessionStore
from proxy.state.sessions import Session, TurnStats

MAX_CHAINED = 65536  # response ids remembered (each ~100 bytes), the oldest forgotten first


def response_id(payloads: Sequence[Mapping[str, Any]]) -> str | None:
    """The id of the response an answer carried: a JSON body's `id`, or an SSE event's `response.id`."""
    for payload in reversed(payloads):
        response = payload.get("response")
        found = response.get("id") if isinstance(response, dict) else None
        if found is None and payload.get("object") == "response":
            found = payload.get("id")
        if isinstance(found, str) and found:
            return found
    return None


class ResponseChains:
    """Response id -> the key of the session it was answered in, per credential, bounded (LRU)."""

    def __init__(self, size: int = MAX_CHAINED) -> None:
        self.size = size
        self._keys: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _slot(credential: str, response: str) -> bytes:
        """A response id is only followed for the credential it was answered to."""
        return hashlib.blake2b(f"{credential}\x00{response}".encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def remember(self, credential: str, payloads: Sequence[Mapping[str, Any]], key: str) -> None:
        found = response_id(payloads)
        if found is None:
            return
        with self._lock:
            self._keys[self._slot(credential, found)] = key
            self._keys.move_to_end(self._slot(credential, found))
            while len(self._keys) > self.size:
                self._keys.popitem(last=False)

    def session_of(self, credential: str, previous: Any) -> str | None:
        """The session key the response `previous` was answered in, if the proxy relayed it."""
        if not isinstance(previous, str):
            return None
        with self._lock:
            return self._keys.get(self._slot(credential, previous))


@dataclass
class UneditedTurn:
    """A turn whose history the upstream holds (`previous_response_id`, `conversation`): forwarded as sent,
    its usage recorded in its session (direct and proxied bill the same) and its response id chained."""

    body: dict
    session: Session
    stats: TurnStats
    dialect: Dialect
    model: ModelInfo
    store: SessionStore
    chain: Callable[[Sequence[Mapping[str, Any]]], None]
    headers: dict[str, str] = field(default_factory=dict)
    strip_usage_chunk: bool = False
    unchanged: bool = True
    commits: bool = False  # the upstream holds the history: nothing of this turn is shared

    def record_usage(self, payloads: Sequence[Mapping[str, Any]]) -> None:
        self.chain(payloads)
        usage = self.dialect.usage(payloads)
        if usage is None or self.stats.prompt_tokens is not None:
            return
        self.stats.prompt_tokens, self.stats.cached_tokens = usage.prompt, usage.cached
        self.stats.cost_usd = self.stats.direct_cost_usd = cost = usage.cost_usd(self.model)
        with self.session.lock:
            self.session.cost_usd += cost
            self.session.direct_cost_usd += cost
        self.store.save(self.session)

    async def refit(self, reported_prompt_tokens: int) -> dict | None:
        return None  # the proxy cannot shorten a history it does not hold

    async def commit(self) -> None:
        return None
