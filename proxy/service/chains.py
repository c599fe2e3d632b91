"""Responses chained by `previous_response_id`: one session, and the usage of the turns forwarded unedited.

A request naming `previous_response_id` carries only its new input (the history lives on the
server), so nothing in it says which session it continues. The id of every response the proxy
relayed is remembered with its session's key, so the next link of the chain lands in that
session, here and, through a shared session store (Redis), on every instance and worker; a link
forwarded unedited still records what the upstream billed for it.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.context.calibration import Calibration
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
    """Response id -> the key of the session it was answered in, per credential, bounded (LRU); shared through
    the session store when it is shared (`SessionStore.chain`, `chained`)."""

    def __init__(self, store: SessionStore | None = None, size: int = MAX_CHAINED) -> None:
        self.store = store
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
        slot = self._slot(credential, found)
        self._keep(slot, key)
        if self.store is not None:
            self.store.chain(slot.hex(), key)

    def _keep(self, slot: bytes, key: str) -> None:
        with self._lock:
            self._keys[slot] = key
            self._keys.move_to_end(slot)
            while len(self._keys) > self.size:
                self._keys.popitem(last=False)

    async def session_of(self, credential: str, previous: Any) -> str | None:
        """The session key the response `previous` was answered in: relayed here, or by another process of a
        shared store (then remembered here too)."""
        if not isinstance(previous, str):
            return None
        slot = self._slot(credential, previous)
        with self._lock:
            key = self._keys.get(slot)
        if key is None and self.store is not None and (key := await self.store.chained(slot.hex())) is not None:
            self._keep(slot, key)
        return key


@dataclass
class UneditedTurn:
    """A turn whose history the upstream holds (`previous_response_id`, `conversation`): forwarded as sent,
    its usage recorded in its session (direct and proxied bill the same) and its response id chained; a
    shared store writes it as any turn (`StoredTurn`: the session's turn count, then its usage), so every
    instance shows the chain's links in one session."""

    body: dict
    session: Session
    stats: TurnStats
    dialect: Dialect
    info: ModelInfo
    store: SessionStore
    chain: Callable[[Sequence[Mapping[str, Any]]], None]
    calibration: Calibration
    headers: dict[str, str] = field(default_factory=dict)
    strip_usage_chunk: bool = False
    unchanged: bool = True
    data: bytes | None = None
    journal_before: Any = None
    stored_journal: Any = None  # None: the session's count of turns not written yet
    usage_stored: bool = False
    shared_model: str = ""  # nothing counted here: nothing to learn the ratio from
    estimate: float = 0.0

    def __post_init__(self) -> None:
        self.journal_before = self.session.journal

    @property
    def model(self) -> str:
        return self.stats.model

    @property
    def commits(self) -> bool:
        """A shared store writes it (its turn count, usage and response id); memory and SQLite keep this copy."""
        return self.store.commits

    def record_usage(self, payloads: Sequence[Mapping[str, Any]]) -> None:
        self.chain(payloads)
        usage = self.dialect.usage(payloads)
        if usage is None or self.stats.prompt_tokens is not None:
            return
        self.stats.prompt_tokens, self.stats.cached_tokens = usage.prompt, usage.cached
        self.stats.cost_usd = self.stats.direct_cost_usd = cost = usage.cost_usd(self.info)
        with self.session.lock:
            self.session.cost_usd += cost
            self.session.direct_cost_usd += cost
        self.store.save(self.session)

    async def refit(self, reported_prompt_tokens: int) -> dict | None:
        return None  # the proxy cannot shorten a history it does not hold

    async def commit(self) -> None:
        await self.store.commit(self)  # its response id too, before the answer ends: the next link may go elsewhere

    async def realign(self) -> None:
        return None  # another process wrote the session first: its journal is this turn's too (nothing edited)
