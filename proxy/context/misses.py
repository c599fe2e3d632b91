"""Live, per turn: did the agent's newest message use what only content the proxy removed held (SPEC §9)?

Two halves of `RecallIndex` (proxy/context/recall.py), wired into a turn: what an epoch removes is
indexed then, once; each turn looks up only the newest assistant message's tokens and calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.context.draft import Draft
from proxy.context.journal import CLEARED, CUT, DROPPED, Decision
from proxy.context.messages import Message
from proxy.context.reach import MAX_SESSION_EVIDENCE, reach_of
from proxy.context.recall import call_keys, message_tokens, never_edited

REMOVING = frozenset({CLEARED, CUT, DROPPED})


def observe_newest(draft: Draft, out: list[Message]) -> tuple[int, int]:
    """Tokens the newest assistant message (new this turn) used from removed content only, and its re-runs;
    and how far back it reached for what it used (`reach.reach_of`, added up in the session's `RecallIndex`).

    `out` is this turn's render before any edit: up to that message, what the agent was sent last turn.
    """
    recall, messages, journal = draft.journal.recall, draft.messages, draft.journal
    new = range(len(messages) - 1, draft.first_new - 1, -1)
    i = next((i for i in new if messages[i].get("role") == "assistant"), -1)
    if i < 0:
        return 0, 0
    reads_reach = recall.evidence < MAX_SESSION_EVIDENCE
    if not (reads_reach or recall.removed or recall.cleared_calls):
        return 0, 0
    tokens = message_tokens(messages[i])
    if reads_reach:
        evidence, older = reach_of(messages, i, journal.outputs, tokens)
        recall.evidence += evidence
        recall.older += older
    if not (recall.removed or recall.cleared_calls):
        return 0, 0
    seen = out[: draft.where[i]] if draft.where[i] >= 0 else out
    return recall.observe(messages[i], seen, tokens)


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
