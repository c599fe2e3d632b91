"""Seed `ClearToolOutputs`: free context by replacing older tool outputs with a placeholder.

A plan names the outputs to clear by stable message id, so the journal can apply the
same decision to next turn's longer copy of the conversation and the upstream sees
the same bytes again (its prompt cache keeps hitting).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from proxy.context.messages import (
    Message,
    content_text,
    ids_at,
    indices_of,
    is_error_output,
    is_tool_output,
    message_digest,
    tool_names,
)
from proxy.context.patterns import compile_patterns
from proxy.context.policy import DEFAULT_ERROR_PATTERNS, ClearPolicy
from proxy.context.tokens import Counter, HeuristicCounter, stated_tokens

PLACEHOLDER = "[output cleared to fit the context window; run the tool again if needed]"
# What every cleared output ends with, the placeholder or a stub keeping some of its lines (`proxy.context.stubs`).
CLEARED_SUFFIX = "cleared to fit the context window; run the tool again if needed]"
# An output sent with fewer characters than this is never worth clearing (the policy's `keep_under` is in tokens, and
# larger): where a marked cache (`ModelInfo.marked_cache`) gets its mark, before the oldest longer one still sent.
FRONTIER_MIN_CHARS = 400


@dataclass(frozen=True)
class Cleared:
    """What a clearing did: how many outputs it cleared and how many tokens that freed."""

    results: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class ClearPlan:
    """The outputs to clear, by stable message id, and the tokens clearing them frees."""

    ids: tuple[str, ...] = ()
    tokens: int = 0

    def indices(self, messages: Sequence[Message], digests: Sequence[bytes] | None = None) -> list[int]:
        """Where the planned outputs sit in `messages` (the last message is never one of them).

        `digests`, when the caller has them, are the messages' `message_digest`s (not recomputed).
        """
        last = len(messages) - 1
        if digests is None:
            digests = [message_digest(m) for m in messages]
        return [i for i in indices_of(self.ids, digests) if i != last]

    def apply(self, messages: list[Message], counter: Counter | None = None) -> Cleared:
        """Clear the planned outputs in place, on this or a longer copy of the conversation.

        Outputs already cleared or no longer present are skipped, so applying twice is harmless.
        """
        counter = counter if counter is not None else HeuristicCounter()
        results = tokens = 0
        for i in self.indices(messages):
            message = messages[i]
            if message.get("content") == PLACEHOLDER:
                continue
            before = counter.count_message(message)
            message["content"] = PLACEHOLDER
            results += 1
            tokens += before - counter.count_message(message)
        return Cleared(results, tokens)


@dataclass(frozen=True)
class ClearToolOutputs:
    """Keep the newest `keep_tokens` of tool output; older outputs become `PLACEHOLDER`.

    Never cleared: the last message, error outputs (unless `errors_keep_under` is set and
    the error is at least that long), outputs under `keep_under` tokens, outputs of tools
    in `exclude_tools`, outputs already cleared. Sizes are an output's content tokens;
    tokens freed are measured on the whole message. Every output still present, exempt
    or not, counts toward the newest `keep_tokens`; the first one (walking back) that
    does not fit entirely is the newest one cleared, and all older ones go with it.
    """

    PLACEHOLDER: ClassVar[str] = PLACEHOLDER

    keep_tokens: int = 20000
    keep_under: int = 500
    exclude_tools: tuple[str, ...] = ()
    clear_at_least: int = 0
    errors_keep_under: int | None = None
    error_patterns: tuple[str, ...] = DEFAULT_ERROR_PATTERNS
    observation_patterns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("exclude_tools", "error_patterns", "observation_patterns"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise TypeError(f"{name} must be a list of strings, not a string")
            object.__setattr__(self, name, tuple(value))
        for name in ("keep_tokens", "keep_under", "clear_at_least", "errors_keep_under"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer, not {value!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClearToolOutputs:
        """The serde form: each key missing takes the default's value; an unknown key is an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown clear_tool_outputs keys: {', '.join(unknown)}")
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        """Every field, lists for tuples, so `from_dict(to_dict())` is the same value."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_policy(cls, policy: ClearPolicy) -> ClearToolOutputs:
        """The clearing a session's policy asks for (`enabled` is the caller's to check)."""
        return cls(**{f.name: getattr(policy, f.name) for f in fields(cls)})

    def plan(
        self, messages: Sequence[Message], counter: Counter | None = None, digests: Sequence[bytes] | None = None
    ) -> ClearPlan:
        """Which outputs `clear` would clear, by stable id; empty if it would free under `clear_at_least`.

        `digests`, when the caller has them, are the messages' `message_digest`s (not recomputed).
        """
        counter = counter if counter is not None else HeuristicCounter()
        observations = compile_patterns(self.observation_patterns)
        outputs = [i for i, m in enumerate(messages) if is_tool_output(m, observations) and not _is_cleared(m)]
        boundary = self._boundary(messages, outputs, counter)
        names = tool_names(messages)
        chosen: list[int] = []
        freed = 0
        for i in outputs[: boundary + 1]:
            saving = self._saving(messages[i], names.get(i) or messages[i].get("name"), counter)
            if i != len(messages) - 1 and saving > 0:
                chosen.append(i)
                freed += saving
        if not chosen or freed < self.clear_at_least:
            return ClearPlan()
        if digests is None:
            digests = [message_digest(m) for m in messages]
        return ClearPlan(tuple(ids_at(digests, chosen)), freed)

    def clear(self, messages: list[Message], counter: Counter | None = None) -> Cleared:
        """Clear older tool outputs of `messages` in place."""
        return self.plan(messages, counter).apply(messages, counter)

    def _boundary(self, messages: Sequence[Message], outputs: list[int], counter: Counter) -> int:
        """Position in `outputs` of the newest output outside the newest `keep_tokens`; -1 if none."""
        kept = 0
        for position in range(len(outputs) - 1, -1, -1):
            kept += _size(messages[outputs[position]], counter)
            if kept > self.keep_tokens:
                return position
        return -1

    def _saving(self, message: Message, tool: str | None, counter: Counter) -> int:
        """Tokens clearing this output would free, or 0 when a rule keeps it."""
        size = _size(message, counter)
        if size < self.keep_under or (tool is not None and tool in self.exclude_tools):
            return 0
        text = content_text(message)
        long_error_clears = self.errors_keep_under is not None and size >= self.errors_keep_under
        if text is not None and not long_error_clears and is_error_output(text, compile_patterns(self.error_patterns)):
            return 0
        return counter.count_message(message) - counter.count_message({**message, "content": PLACEHOLDER})


def _size(message: Message, counter: Counter) -> int:
    """An output's own tokens, without the chat framing: what `keep_tokens` and `keep_under` measure (its text,
    and the tokens a dialect stated beside it: a screenshot's)."""
    text = content_text(message)
    return counter.count_text(text) + stated_tokens(message) if text is not None else counter.count_message(message)


def is_cleared(text: object) -> bool:
    """The placeholder, or a stub: an output the proxy cleared."""
    return isinstance(text, str) and text.endswith(CLEARED_SUFFIX)


def _is_cleared(message: Message) -> bool:
    return is_cleared(message.get("content"))
