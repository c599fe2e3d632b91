"""Seed `ContextWindow`: a fixed-capacity token window with a protected system prompt.

The proxy fits chat messages (`fitting.py`); this is the seed's primitive on plain
token lists, kept exact so the policy has one reference to be tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum


class TruncationStrategy(Enum):
    """Which conversation tokens go when the window overflows."""

    TRUNCATE_LEFT = "truncate_left"  # drop the oldest
    TRUNCATE_RIGHT = "truncate_right"  # drop the newest
    MIDDLE_OUT = "middle_out"  # drop from the middle, keeping both ends


class ContextError(ValueError):
    """A request the window cannot hold at all (a system prompt larger than the window)."""


def _kept_ranges(length: int, capacity: int, strategy: TruncationStrategy) -> list[tuple[int, int]]:
    """The half-open index ranges of a `length`-token conversation that survive in `capacity`."""
    capacity = max(0, capacity)
    if length <= capacity:
        return [(0, length)]
    if strategy is TruncationStrategy.TRUNCATE_LEFT:
        return [(length - capacity, length)]
    if strategy is TruncationStrategy.TRUNCATE_RIGHT:
        return [(0, capacity)]
    head = capacity // 2  # the newest end gets the odd token: it is what the model answers
    return [(0, head), (length - (capacity - head), length)]


@dataclass
class ContextWindow:
    """System prompt plus conversation, together never more than `max_tokens`."""

    max_tokens: int
    strategy: TruncationStrategy = TruncationStrategy.TRUNCATE_LEFT
    system_tokens: list[int] = field(default_factory=list)
    conversation: list[int] = field(default_factory=list)

    def _capacity(self) -> int:
        return max(0, self.max_tokens - len(self.system_tokens))

    def set_system_prompt(self, tokens: Sequence[int]) -> None:
        """Replace the system prompt; the conversation is truncated if it no longer fits.

        Raises ContextError when the prompt alone is larger than the window (equal fits).
        """
        if len(tokens) > self.max_tokens:
            raise ContextError(f"system prompt of {len(tokens)} tokens exceeds the window of {self.max_tokens}")
        self.system_tokens = list(tokens)
        self.truncate_to_fit()

    def append(self, tokens: Sequence[int]) -> int:
        """Append, then truncate per the strategy; returns how many of `tokens` are still present."""
        old = len(self.conversation)
        combined = self.conversation + list(tokens)
        ranges = _kept_ranges(len(combined), self._capacity(), self.strategy)
        self.conversation = [t for start, end in ranges for t in combined[start:end]]
        return sum(max(0, end - max(start, old)) for start, end in ranges)

    def truncate_to_fit(self) -> int:
        """Apply the strategy until system + conversation fit; returns how many tokens were removed."""
        before = len(self.conversation)
        ranges = _kept_ranges(before, self._capacity(), self.strategy)
        self.conversation = [t for start, end in ranges for t in self.conversation[start:end]]
        return before - len(self.conversation)

    def tokens(self) -> list[int]:
        """System then conversation tokens, flat; always within `max_tokens`, even after a field was edited."""
        ranges = _kept_ranges(len(self.conversation), self._capacity(), self.strategy)
        return self.system_tokens[: self.max_tokens] + [t for s, e in ranges for t in self.conversation[s:e]]

    def len(self) -> int:
        """Total tokens held: system plus conversation."""
        return len(self.system_tokens) + len(self.conversation)

    def __len__(self) -> int:
        return self.len()

    def is_empty(self) -> bool:
        """True when neither a system prompt nor any conversation is held."""
        return not self.system_tokens and not self.conversation

    def remaining_capacity(self) -> int:
        """Tokens that can still be appended before anything is truncated."""
        return max(0, self.max_tokens - self.len())

    def is_at_limit(self) -> bool:
        """True when the window is full (or beyond, if a field was edited by hand)."""
        return self.len() >= self.max_tokens

    def clear_conversation(self) -> None:
        """Forget the conversation; the system prompt stays."""
        self.conversation = []

    def utilization(self) -> float:
        """Share of `max_tokens` in use; 0.0 for a zero-sized window rather than a division error."""
        if self.max_tokens == 0:
            return 0.0
        return self.len() / self.max_tokens
