"""Synthetic agent conversations of a chosen size, cut from a real trace's messages.

The mini_django trace's units (a tool call with its output) are repeated until the
conversation reaches the size asked, each copy salted so no two messages are equal
(so no cache, dedup or digest sees a repeat the real agent would not have sent).
"""

from __future__ import annotations

import itertools
from typing import Any

from proxy.context.tokens import REPLY_PRIMING
from proxy.demo.traces import load_trace
from proxy.tokens.counter import TokenCounter

TRACE = "mini_django-11138.tools.json"
ENCODING = "o200k_base"


def _salted(message: dict[str, Any], salt: str) -> dict[str, Any]:
    out = dict(message)
    if isinstance(out.get("content"), str) and out["content"]:
        out["content"] = f"{out['content']}\n[{salt}]"
    if out.get("tool_calls"):
        out["tool_calls"] = [{**c, "id": f"{c['id']}_{salt}"} for c in out["tool_calls"]]
    if out.get("tool_call_id"):
        out["tool_call_id"] = f"{out['tool_call_id']}_{salt}"
    return out


def _units(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The trace's history after its task, as units: an assistant message and the results that follow it."""
    units: list[list[dict[str, Any]]] = []
    for message in messages[2:]:
        if message.get("role") == "assistant" or not units:
            units.append([message])
        else:
            units[-1].append(message)
    return [u for u in units if u[0].get("role") == "assistant" and _answered(u)]


def _answered(unit: list[dict[str, Any]]) -> bool:
    """Every tool call of the unit's assistant message has its result (the trace's last call has none)."""
    calls = {c["id"] for c in unit[0].get("tool_calls") or ()}
    return calls <= {m.get("tool_call_id") for m in unit[1:]}


class Conversation:
    """A growing agent conversation: `head(tokens)` to start, `next_unit()` for each warm turn."""

    def __init__(self, salt: str) -> None:
        trace = load_trace(TRACE)
        self.tools = trace.tools
        self.salt = salt
        self.counter = TokenCounter(ENCODING)  # its own cache: building a conversation warms no one else's
        self._source = itertools.cycle(_units(trace.messages))
        self._copies = itertools.count()
        self.messages: list[dict[str, Any]] = [_salted(m, salt) for m in trace.messages[:2]]

    def next_unit(self) -> list[dict[str, Any]]:
        """The next assistant turn with its tool results, appended to the conversation and returned."""
        salt = f"{self.salt}-{next(self._copies)}"
        unit = [_salted(m, salt) for m in next(self._source)]
        self.messages += unit
        return unit

    def grow_to(self, tokens: int) -> list[dict[str, Any]]:
        """Append units until the conversation holds at least `tokens` tokens; the messages."""
        total = sum(self.counter.count_message(m) for m in self.messages) + REPLY_PRIMING
        while total < tokens:
            total += sum(self.counter.count_message(m) for m in self.next_unit())
        return self.messages
