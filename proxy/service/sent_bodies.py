"""The bytes of the last chat body each session sent upstream, so a warm turn serialises only its new messages.

Between epochs a turn's body is the last one's with messages appended: the same fields, the same messages in
front. orjson writes a list as `[` + its items' bytes joined by `,` + `]` and an object's fields in order, so
the new body's bytes are the last body's up to the end of its last message, the new messages' bytes, and the
last body's bytes after its messages. That holds while the client's other fields are the very objects parsed
last turn (the body memo shares them, proxy.service.body_memos), the client's messages up to there are the very
objects too, and what goes upstream for them is equal, from the same sources: each is then the same dict, built
the same way from the same message, so it has the same bytes. Any other turn is serialised whole.

Bounded in bytes (a share of `[state] memory_mb`, counted with the sessions'), least recently used first.
"""

from __future__ import annotations

import operator
import secrets
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

_MARKER = "\x00context-proxy-messages-" + secrets.token_hex(16)  # random per process: no body holds it
_MARKER_JSON = orjson.dumps(_MARKER)
_WRAP_HEAD, _WRAP_TAIL = b'{"m":[', b"]}"  # new messages serialised at their depth in a body: {"m": [...]}
_OPEN_BRACKET = ord("[")
HELD_PER_BYTE = 3  # the bytes kept, and the parsed messages and sent ones they keep alive (about twice the JSON)


@dataclass(frozen=True, slots=True)
class _Sent:
    fields: tuple[tuple[str, Any], ...]  # the client body's fields but its messages: the objects themselves
    flags: tuple[Any, ...]  # what else shaped the body (the session's prompt cache key)
    messages: list[dict[str, Any]]  # the client's messages
    out: list[dict[str, Any]]  # what went upstream for them
    sources: list[int]  # the client message each one renders (-1: the engine's)
    data: bytes  # the body's bytes
    tail: int  # how many of them follow its messages array's `]`

    @property
    def cost(self) -> int:
        return HELD_PER_BYTE * len(self.data)

    def appended(self, new: list[dict[str, Any]]) -> bytes:
        """These bytes with `new` messages at the end of the messages array (one copy of them)."""
        if not new:
            return self.data
        added = orjson.dumps({"m": new})[len(_WRAP_HEAD) : -len(_WRAP_TAIL)]
        close = len(self.data) - self.tail - 1
        whole = memoryview(self.data)
        comma = b"," if self.data[close - 1] != _OPEN_BRACKET else b""
        return b"".join((whole[:close], comma, added, whole[close:]))


def _fields(client_body: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple((k, v) for k, v in client_body.items() if k != "messages")


def _same_fields(a: tuple[tuple[str, Any], ...], b: tuple[tuple[str, Any], ...]) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and x[1] is y[1] for x, y in zip(a, b, strict=True))


def _leads(prefix: Sequence[Any], items: Sequence[Any]) -> bool:
    """`prefix` is the start of `items`, object for object."""
    return len(prefix) <= len(items) and all(map(operator.is_, prefix, items))


class SentBodies:
    """Per session key, the bytes of its last serialised chat body and what they were made from."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.held = 0
        self._sent: OrderedDict[str, _Sent] = OrderedDict()
        self._lock = threading.Lock()  # turns may run on the engine's worker thread

    def __len__(self) -> int:
        return len(self._sent)

    def serialise(
        self,
        key: str,
        client_body: Mapping[str, Any],
        body: Mapping[str, Any],
        sources: list[int],
        flags: tuple[Any, ...] = (),
    ) -> bytes | None:
        """`orjson.dumps(body)`, where `body` is `client_body` with what goes upstream for its messages (`sources`:
        the client message each renders) and maybe stream options added; from the last body's bytes when they
        lead this one. None when orjson cannot write it (the caller's own serialisation then says why)."""
        with self._lock:
            last = self._sent.get(key)
        messages, out = client_body.get("messages"), body.get("messages")
        if not isinstance(messages, list) or not isinstance(out, list) or len(sources) != len(out):
            return None
        fields = _fields(client_body)
        try:
            if last is not None and self._extends(last, fields, flags, messages, out, sources):
                data, tail = last.appended(out[len(last.out) :]), last.tail
            else:
                data = orjson.dumps(body)
                tail = len(orjson.dumps({**body, "messages": _MARKER}).partition(_MARKER_JSON)[2])
        except orjson.JSONEncodeError:
            return None
        self._keep(key, _Sent(fields, flags, messages, out, sources, data, tail))
        return data

    @staticmethod
    def _extends(
        last: _Sent,
        fields: tuple[tuple[str, Any], ...],
        flags: tuple[Any, ...],
        messages: list[dict[str, Any]],
        out: list[dict[str, Any]],
        sources: list[int],
    ) -> bool:
        n = len(last.out)
        return (
            last.flags == flags
            and _same_fields(last.fields, fields)
            and _leads(last.messages, messages)
            and n <= len(out)
            and sources[:n] == last.sources
            and out[:n] == last.out
        )

    def _keep(self, key: str, sent: _Sent) -> None:
        with self._lock:
            old = self._sent.pop(key, None)
            if old is not None:
                self.held -= old.cost
            if sent.cost > self.budget:
                return
            self._sent[key] = sent
            self.held += sent.cost
            while self.held > self.budget and self._sent:
                self.held -= self._sent.popitem(last=False)[1].cost

    def fit(self, budget_bytes: int) -> None:
        """Hold at most `budget_bytes` from now on (a config reload's), the least recently used dropped."""
        if budget_bytes == self.budget:
            return
        with self._lock:
            self.budget = budget_bytes
            while self.held > self.budget and self._sent:
                self.held -= self._sent.popitem(last=False)[1].cost
