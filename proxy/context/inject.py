"""Capsules (seed `ContextRequest`) injected per turn, diffed (seed `ContextDiff`) against the last.

Only capsules new to the conversation are injected, in one system message placed after
the prefix the upstream has cached; kept ones stay where they were first injected (the
journal replays them), so nothing is sent twice and the cached prefix is never touched,
except by an epoch: a capsule removed or changed in the config is a reason for one, which
takes it out of the body (`stale_capsules`, `drop_capsules`); a changed one is then new.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.context.capsules import Capsule, ContextRequest, select_capsules
from proxy.context.diff import ContextBlock, ContextDiff, build_context_diff
from proxy.context.journal import Injection, Journal
from proxy.context.messages import Message, content_text
from proxy.context.policy import CapsulePolicy
from proxy.context.tokens import Counter

CAPSULE_HEADER = "Context for this conversation:"


def inject_capsules(
    state: Journal,
    messages: Sequence[Message],
    first_new: int,
    wanted: CapsulePolicy,
    counter: Counter,
    capsules: Sequence[Capsule],
) -> ContextDiff:
    """Select this turn's capsules; inject only those new to the conversation, in one system message."""
    if not capsules and not state.snapshot:
        return ContextDiff()
    chosen = _select(messages, wanted, counter, capsules)
    now = [ContextBlock(c.id, c.text_key, c.kind, c.tokens(counter)) for c in chosen]
    diff = build_context_diff(state.snapshot, now)
    present = state.injected()
    added = {b.anchor for b in diff.added}
    fresh = [c for c in chosen if c.id in added and _key(c) not in present]
    anchor = _anchor(messages, first_new)
    if fresh and anchor is None:
        deferred = {c.id for c in fresh}
        state.snapshot = [b for b in now if b.anchor not in deferred]
        return diff
    if fresh and anchor is not None:
        state.injections.append(Injection(anchor, tuple(_key(c) for c in fresh), _message_text(fresh)))
    state.snapshot = now
    return diff


def stale_capsules(state: Journal, capsules: Sequence[Capsule]) -> set[str]:
    """Keys of capsules in the conversation that the config no longer holds as they were (removed or changed)."""
    return state.injected() - {_key(c) for c in capsules}


def drop_capsules(state: Journal, stale: set[str], capsules: Sequence[Capsule]) -> None:
    """Take the `stale` capsules out of the messages that carry them (in an epoch: the prefix changes).

    What stays in a message is configured as it was injected, so its text is written again from `capsules`.
    """
    if not stale:
        return
    by_key = {_key(c): c for c in capsules}
    kept: list[Injection] = []
    for injection in state.injections:
        keys = tuple(k for k in injection.capsules if k not in stale)
        if keys == injection.capsules:
            kept.append(injection)
        elif keys:
            kept.append(Injection(injection.anchor, keys, _message_text([by_key[k] for k in keys])))
    state.injections = kept


def _message_text(capsules: Sequence[Capsule]) -> str:
    return "\n\n".join([CAPSULE_HEADER, *(f"[{c.kind}: {c.id}]\n{c.text}" for c in capsules)])


def _select(
    messages: Sequence[Message], wanted: CapsulePolicy, counter: Counter, capsules: Sequence[Capsule]
) -> list[Capsule]:
    """The capsules this turn's query (the last user message) calls for, within the policy's budget."""
    query = next((content_text(m) or "" for m in reversed(messages) if m.get("role") == "user"), "")
    request = ContextRequest(
        query=query,
        budget_tokens=wanted.budget_tokens,
        tags=list(wanted.tags),
        min_score=wanted.min_score,
        max_capsules=wanted.max_capsules,
        prefer_roles=list(wanted.prefer_roles),
        kinds=list(wanted.kinds),
    )
    return select_capsules(request, capsules, counter).capsules


def _key(capsule: Capsule) -> str:
    return f"{capsule.id}#{capsule.text_key}"


def _anchor(messages: Sequence[Message], first_new: int) -> int | None:
    """Where new capsules go: before the last user message if it is new, else before the first new unit.

    Never inside the prefix last turn sent (that would re-bill it) nor between a call and its results.
    """
    for i in range(len(messages) - 1, first_new - 1, -1):
        if messages[i].get("role") == "user":
            return i
    if first_new < len(messages) and messages[first_new].get("role") != "tool":
        return first_new
    return None
