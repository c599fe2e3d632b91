"""The edit kinds, one module each (clear, dedup, cut, truncate, agent messages, compact), run in this order in an
epoch.

A new kind is a new module with a `Step` (`base.py`) and one entry in `steps()`.
"""

from __future__ import annotations

from proxy.context.steps.agent_messages import AgentMessages
from proxy.context.steps.base import Epoch, Step
from proxy.context.steps.clear import Clearing
from proxy.context.steps.compact import Compaction
from proxy.context.steps.cut import CutCache, Cutting
from proxy.context.steps.dedup import Dedup
from proxy.context.steps.truncate import Truncation


def steps(cuts: CutCache) -> tuple[Step, ...]:
    """The epoch's steps in order: clearing first (it is planned before the epoch), compaction last (it points
    only at what the others left standing)."""
    return (Clearing(), Dedup(), Cutting(cuts), Truncation(), AgentMessages(cuts), Compaction())


__all__ = [
    "AgentMessages",
    "Clearing",
    "Compaction",
    "CutCache",
    "Cutting",
    "Dedup",
    "Epoch",
    "Step",
    "Truncation",
    "steps",
]
