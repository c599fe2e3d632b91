"""Seed `ContextDiff`: what changed in the emitted blocks since last turn's snapshot.

Only `added` needs sending; `kept` carries anchors without bodies, so a block the
model already saw is never sent twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.context.tokens import HeuristicCounter

_HEURISTIC = HeuristicCounter()


@dataclass(frozen=True)
class ContextBlock:
    """One emitted block: an anchor naming it, its text, and a cheap token estimate."""

    anchor: str
    text: str
    kind: str = ""
    tokens_estimated: int = -1  # -1: estimated from `text` by the heuristic counter

    def __post_init__(self) -> None:
        if self.tokens_estimated < 0:
            object.__setattr__(self, "tokens_estimated", _HEURISTIC.count_text(self.text))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form the journal stores."""
        return {"anchor": self.anchor, "text": self.text, "kind": self.kind, "tokens_estimated": self.tokens_estimated}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContextBlock:
        """Inverse of `to_dict`; a missing estimate is recomputed from the text."""
        return cls(
            str(data["anchor"]),
            str(data.get("text", "")),
            str(data.get("kind", "")),
            int(data.get("tokens_estimated", -1)),
        )


@dataclass
class ContextDiff:
    """Blocks added since the snapshot, anchors removed, anchors kept; empty by default."""

    added: list[ContextBlock] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    tokens_estimated_added: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: blocks as dicts, anchors as strings."""
        return {
            "added": [b.to_dict() for b in self.added],
            "removed": list(self.removed),
            "kept": list(self.kept),
            "tokens_estimated_added": self.tokens_estimated_added,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContextDiff:
        """Inverse of `to_dict`; a missing key takes the empty default."""
        return cls(
            added=[ContextBlock.from_dict(b) for b in data.get("added", [])],
            removed=[str(a) for a in data.get("removed", [])],
            kept=[str(a) for a in data.get("kept", [])],
            tokens_estimated_added=int(data.get("tokens_estimated_added", 0)),
        )

    def summary(self) -> str:
        """The `X-Context-Diff` header's value."""
        return (
            f"added={len(self.added)} kept={len(self.kept)} removed={len(self.removed)} "
            f"tokens_added={self.tokens_estimated_added}"
        )


def build_context_diff(before: Sequence[ContextBlock], now: Sequence[ContextBlock]) -> ContextDiff:
    """Split `now` against the snapshot `before`, block by block.

    A block whose text changed under the same anchor is a new block: its anchor is in
    `added` (with the new body) and in `removed` (the old body is gone), so kept + removed
    accounts for every block before and kept + added for every block now.
    """
    seen: dict[str, set[str]] = {}
    for block in before:
        seen.setdefault(block.anchor, set()).add(block.text)
    still: dict[str, set[str]] = {}
    for block in now:
        still.setdefault(block.anchor, set()).add(block.text)
    diff = ContextDiff()
    kept: dict[str, None] = {}
    for block in now:
        if block.text in seen.get(block.anchor, ()):
            kept[block.anchor] = None
        else:
            diff.added.append(block)
    removed: dict[str, None] = {}
    for block in before:
        if block.text not in still.get(block.anchor, ()):
            removed[block.anchor] = None
    diff.kept = list(kept)
    diff.removed = list(removed)
    diff.tokens_estimated_added = sum(b.tokens_estimated for b in diff.added)
    return diff
