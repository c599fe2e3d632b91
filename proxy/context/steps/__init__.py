"""The edit kinds, one module each (clear, dedup, cut, truncate), run in this order in an epoch.

A new kind is a new module with a `Step` (`base.py`) and one entry in `steps()`.
"""

from __future__ import annotations

from proxy.context.steps.base import Epoch, Step
from proxy.context.steps.clear import Clearing
from proxy.context.steps.cut import CutCache, Cutting
from proxy.context.steps.dedup import Dedup
from proxy.context.steps.truncate import Truncation


def steps(cuts: CutCache) -> tuple[Step, ...]:
    """The epoch's steps in order: clearing first (it is planned before the epoch), truncation last."""
    return (Clearing(), Dedup(), Cutting(cuts), Truncation())


__all__ = ["Clearing", "CutCache", "Cutting", "Dedup", "Epoch", "Step", "Truncation", "steps"]
