"""Live, per turn: did the agent's newest message use what only content the proxy removed held (SPEC §9)?

Two halves of `RecallIndex` (proxy/context/recall.py), wired into a turn: what an epoch removes is
indexed then, once; each turn looks up only the newest assistant message's tokens and calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.context.draft import Draft
from proxy.context.journal import CLEARED, CUT, DROPPED, Decision
from proxy.context.messages import Message
from proxy.context.recall import call_keys, never_edited

REMOVING = frozenset({CLEARED, CUT, DROPPED})


def observe_newest(draft: Draft, out: list[Message]) -> tuple[int, int]:
    """Tokens the newest assistant message (new this turn) used from removed content only, and its re-runs.

    `out` is this turn's render before any edit: up to that message, what the agent was sent last turn.
    """
    recall, messages = draft.journal.recall, draft.messages
    if not (recall.removed or recall.cleared_calls):
        return 0, 0
    for i in range(len(messages) - 1, draft.first_new - 1, -1):
        if messages[i].get("role") == "assistant":
            seen = out[: draft.where[i]] if draft.where[i] >= 0 else out
            return recall.observe(messages[i], seen)
    return 0, 0


def index_removed(draft: Draft, before: Sequence[Decision]) -> None:
    """Index the messages this epoch removed (cleared, cut or dropped) and the calls whose output it cleared."""
    decisions = draft.journal.decisions
    changed = enumerate(zip(before, decisions, strict=False))
    removed = [i for i, (old, new) in changed if old is not new and new.kind in REMOVING]
    if not removed:
        return
    messages = draft.messages
    cleared_ids = {messages[i].get("tool_call_id") for i in removed if decisions[i].kind == CLEARED}
    keys = []
    for message in messages:
        for call, key in zip(message.get("tool_calls") or (), call_keys(message), strict=False):
            if isinstance(call, dict) and call.get("id") in cleared_ids:
                keys.append(key)
    draft.journal.recall.forget([messages[i] for i in removed], keys, never_edited(messages))
