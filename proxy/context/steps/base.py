"""What every edit kind provides: what it sends for a message it decided, and its part of an epoch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from proxy.context.clearing import ClearPlan
from proxy.context.journal import TurnReport
from proxy.context.messages import Message

if TYPE_CHECKING:
    from proxy.context.draft import Draft
    from proxy.context.journal import Decision

WINDOW_REASONS = frozenset({"window", "soft_budget"})


@dataclass(frozen=True)
class Epoch:
    """Why this turn edits its prefix, and the clearing plan made while deciding so."""

    reasons: tuple[str, ...]
    plan: ClearPlan | None = None

    @property
    def over_budget(self) -> bool:
        """The window or the soft budget demands it: cuts and truncation run too."""
        return not WINDOW_REASONS.isdisjoint(self.reasons)


class Step(Protocol):
    """One edit kind, the way a mitmproxy addon is one concern: a new kind is a new module in this package."""

    kind: str  # the journal's decision kind this step records

    def emit(self, draft: Draft, i: int, decision: Decision) -> Message | None:
        """What is sent for client message `i` under this step's `decision` (None: nothing)."""
        ...

    def edit(self, draft: Draft, epoch: Epoch, report: TurnReport) -> None:
        """This step's edits in an epoch, recorded with `draft.decide` and counted in `report`."""
        ...
