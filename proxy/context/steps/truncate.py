"""Truncation (seed `ContextWindow`): whole units removed down to the low-water mark, a note in their place."""

from __future__ import annotations

from proxy.context.draft import Draft
from proxy.context.fitting import fit_messages
from proxy.context.journal import DROPPED, Decision, TurnReport
from proxy.context.steps.base import Epoch

_DROPPED = Decision(DROPPED)


class Truncation:
    kind = DROPPED

    def emit(self, draft: Draft, i: int, decision: Decision) -> None:
        return None

    def edit(self, draft: Draft, epoch: Epoch, report: TurnReport) -> None:
        """Remove whole units down to the low-water mark (or under the soft budget)."""
        if not epoch.over_budget:
            return
        policy = draft.policy
        out, counts = draft.render()
        target = policy.low_water * draft.usable
        if policy.soft_budget_tokens:
            target = min(target, policy.soft_budget_tokens * policy.low_water / policy.high_water)
        if draft.total(counts) <= target:
            return
        visible = draft.visible()
        rows = [draft.where[i] for i in visible]
        fixed = draft.fixed + sum(counts) - sum(counts[j] for j in rows)
        fit = fit_messages(
            [out[j] for j in rows],
            [counts[j] for j in rows],
            budget=int(draft.usable / draft.correction),
            target=int(target / draft.correction),
            strategy=policy.truncation,
            pin_first_user=policy.pin_first_user,
            fixed_tokens=fixed,
            counter=draft.counter,
        )
        for i, keep in zip(visible, fit.keep, strict=True):
            if not keep:
                draft.decide(i, _DROPPED)
        report.removed = fit.removed
