"""Cuts (`steps/cut.py`, `steps/agent_messages.py`) touch only a message's own text: one the dialect marks opaque
(thinking, a sealed reasoning blob) is never cut, even when its estimate changed since the cut cache was last asked
for it (a Responses reasoning item's token estimate follows the learned scale, its digest the client's bytes): the
cache (`CutCache.cut`) keeps no content for such a message."""

from __future__ import annotations

from typing import Any

from proxy.context.draft import Draft
from proxy.context.fitting import oversized_limit
from proxy.context.journal import AS_SENT, CUT, Journal, TurnReport
from proxy.context.messages import Message
from proxy.context.policy import Policy
from proxy.context.steps import AgentMessages, CutCache, Cutting, Epoch
from proxy.tokens.counter import counter_for
from tests.context.replay import model

COUNTER = counter_for("o200k_base")
WINDOW = 16_000


def _opaque(tokens: int) -> list[dict[str, Any]]:
    return [{"type": "opaque", "text": "reasoning " * 2000, "tokens": tokens}]


def _draft(messages: list[Message], cache: CutCache) -> Draft:
    journal = Journal()
    for i, message in enumerate(messages):
        tokens = COUNTER.count_message(message)
        journal.append(bytes([i]), tokens, tokens, message.get("role") == "tool")
    steps = {CUT: Cutting(cache).emit}
    draft = Draft(messages, journal, Policy(), model(WINDOW, 1.0), COUNTER, WINDOW - 4096, 0, 1.0, steps)
    draft.render()
    return draft


def _conversation(opaque: list[dict[str, Any]]) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Go."}]
    messages.append({"role": "assistant", "content": "I start.", "tool_calls": [_call(0)]})
    messages.append({"role": "tool", "tool_call_id": "c0", "content": "ok"})
    messages.append({"role": "assistant", "content": opaque, "tool_calls": [_call(1)]})  # reasoning, then a call
    messages.append({"role": "tool", "tool_call_id": "c1", "content": "ok"})
    for k in range(2, 10):
        messages.append({"role": "assistant", "content": f"step {k}", "tool_calls": [_call(k)]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": "ok"})
    messages.append({"role": "user", "content": "go on"})
    return messages


def _call(k: int) -> dict[str, Any]:
    return {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}


def test_an_opaque_message_is_never_cut_when_its_estimate_changed_since_the_cache_saw_it() -> None:
    cache = CutCache()
    earlier = _draft(_conversation(_opaque(9000)), cache)
    # a turn ago the same item (same digest) was estimated lower, and the cache was asked for its cuts then
    limit = oversized_limit(earlier.usable, Policy().max_message_share)
    cache.cut(earlier.messages[4], earlier.journal.digests[4], limit, COUNTER)
    cache.cut(earlier.messages[4], earlier.journal.digests[4], Policy().agent_message_tokens, COUNTER)
    draft = _draft(_conversation(_opaque(9500)), cache)
    draft.first_decided = 3  # an epoch whose first change comes before the opaque message
    report = TurnReport(turn=2, tokens_before=0, tokens_after=0)

    Cutting(cache).edit(draft, Epoch(("window",)), report)
    AgentMessages(cache).edit(draft, Epoch(("window",)), report)

    assert draft.journal.decisions[4] is AS_SENT and report.cut == 0
