"""Dedup: a repeated tool output becomes a one-line reference to the earlier one (`proxy.context.dedup`).

A new duplicate is replaced as it arrives (that touches no earlier message); older ones
wait for an epoch, and a reference whose original is gone gets its body back.
"""

from __future__ import annotations

from proxy.context.dedup import MIN_TOKENS, body_digest, duplicates, reference, with_reference
from proxy.context.draft import Draft
from proxy.context.journal import AS_SENT, DEDUPED, Decision, TurnReport
from proxy.context.messages import Message, newest
from proxy.context.steps.base import Epoch


class Dedup:
    kind = DEDUPED

    def emit(self, draft: Draft, i: int, decision: Decision) -> Message:
        return with_reference(draft.messages[i], decision.reference)

    def arrived(self, draft: Draft, i: int, tokens: int) -> bool:
        """Journal new output `i`'s body; True when it repeats a kept output and is sent as a reference."""
        journal = draft.journal
        body = body_digest(draft.messages[i])
        if body is None:
            return False
        target = journal.bodies.get(body)
        if target is None or journal.decisions[target] is not AS_SENT:
            journal.bodies[body] = i
            return False
        if i == newest(draft.messages) or tokens < MIN_TOKENS:
            return False
        draft.decide(i, Decision(DEDUPED, reference=reference(draft.messages[target]), target=target))
        return True

    def edit(self, draft: Draft, epoch: Epoch, report: TurnReport) -> None:
        journal, last, visible = draft.journal, newest(draft.messages), draft.visible()
        if draft.policy.dedup:
            # Only the window may make dedup edit the prefix on its own; else it rides on what the epoch
            # rewrites anyway (from its first edit on), at no cost to the cache the epoch was priced by.
            start = 0 if epoch.over_budget else draft.first_decided if draft.first_decided is not None else last
            kept = [i for i in visible if i >= start and journal.decisions[i] is AS_SENT]
            candidates = [i for i in kept if journal.outputs[i] and i != last]
            found = duplicates(draft.messages, candidates, journal.tokens)
            for i, target in found.items():
                draft.decide(i, Decision(DEDUPED, reference=reference(draft.messages[target]), target=target))
            report.deduped += len(found)
        _release_dangling(draft, visible)  # also when dedup was turned off: no reference may outlive its original


def _release_dangling(draft: Draft, visible: list[int]) -> None:
    """A reference whose original was cleared, cut or dropped gets its body back; the body map is rebuilt."""
    journal = draft.journal
    for i in visible:
        decision = journal.decisions[i]
        if decision.kind == DEDUPED and journal.decisions[decision.target] is not AS_SENT:
            draft.decide(i, AS_SENT)
    bodies = {body: i for body, i in journal.bodies.items() if journal.decisions[i] is AS_SENT}
    for i in visible:
        if journal.outputs[i] and journal.decisions[i] is AS_SENT and i not in bodies.values():
            body = body_digest(draft.messages[i])
            if body is not None:
                bodies.setdefault(body, i)
    journal.bodies = bodies
