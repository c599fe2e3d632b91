"""The window policy on chat messages: whole units removed down to a low-water mark.

The seed `ContextWindow` truncates a token list; here the same strategies act on
chat messages, where a tool call and its results must go together (an upstream
refuses a result without its call) and some messages are never removed. The
caller decides when to fit (past the high-water mark) and passes the low-water
mark as `target`, so removals come in rare batches and the prompt cache survives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.context.messages import INSTRUCTION_ROLES, Message, call_ids, content_text, newest, units
from proxy.context.policy import TRUNCATIONS
from proxy.context.tokens import Counter, HeuristicCounter
from proxy.context.window import TruncationStrategy

PROTECTED_ROLES = INSTRUCTION_ROLES
NOTE_TEXT = "[{n} earlier messages omitted]"
CUT_MARKER = "[... {n} tokens cut ...]"

# The note is the proxy speaking, not the user: as "system" it is never taken for a
# request to answer, and it cannot become the "last user message" (the capsule query,
# and in agent traces the task is often the only user message). OpenAI accepts a
# system message anywhere; an upstream whose chat template wants system messages
# first only can be served with note_role="user".
NOTE_ROLE = "system"


def omission_note(removed: int, role: str = NOTE_ROLE) -> dict[str, Any]:
    """The short message that takes the place of what was removed."""
    return {"role": role, "content": NOTE_TEXT.format(n=removed)}


@dataclass
class Fit:
    """What fitting decided: which input messages stay, and the note that replaces the rest."""

    keep: list[bool]
    removed: int
    tokens: int
    note: dict[str, Any] | None
    fits: bool

    @property
    def note_index(self) -> int | None:
        """Where the note goes in the output: after the kept messages that preceded the first removed one."""
        if self.note is None:
            return None
        first_removed = self.keep.index(False)
        return sum(self.keep[:first_removed])

    def apply(self, messages: Sequence[Message]) -> list[Message]:
        """The output list: kept messages in order, the note in place of the first removed unit."""
        out = [m for m, kept in zip(messages, self.keep, strict=True) if kept]
        index = self.note_index
        if index is not None and self.note is not None:
            out.insert(index, self.note)
        return out


def task_length(messages: Sequence[Message]) -> int:
    """How many messages the task is: every message before the agent's first reply (Codex sends its
    `<environment_context>` as the first user message and the task after it), at least the first user message."""
    first_reply = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), -1)
    return max(first_reply, first_user + 1)


def never_cut(messages: Sequence[Message], pin_task: bool = True) -> list[bool]:
    """Per message: True when it is never cut: system and developer messages (an agent's
    instructions, wherever they sit) and, with `pin_task`, the task (`task_length`)."""
    flags = [m.get("role") in PROTECTED_ROLES for m in messages]
    if pin_task:
        task = min(task_length(messages), len(messages))
        flags[:task] = [True] * task
    return flags


def protected(messages: Sequence[Message], pin_first_user: bool = True) -> list[bool]:
    """Per message: True when no strategy may remove it (its whole unit then stays too): what is never cut
    (`pin_first_user`: the task with it), the last user message, the last and the newest message (`messages.newest`),
    and the agent's newest step
    (its last reply when that reply calls tools: the results it answers with come next, even when a system or
    user message follows them, as Claude Code's reminders do; without it the agent asks for that step again)."""
    flags = never_cut(messages, pin_first_user)
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if users:
        flags[users[-1]] = True
    replies = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if replies and _calls_tools(messages[replies[-1]]):
        flags[replies[-1]] = True
    if flags:
        flags[-1] = flags[newest(messages)] = True
    return flags


def _calls_tools(message: Message) -> bool:
    return bool(call_ids(message)) or isinstance(message.get("function_call"), dict)


def removable_units(messages: Sequence[Message], pin_first_user: bool = True) -> list[tuple[int, int]]:
    """The units, oldest first, that hold no protected message."""
    flags = protected(messages, pin_first_user)
    return [(s, e) for s, e in units(messages) if not any(flags[s:e])]


def removal_order(spans: list[tuple[int, int]], strategy: str) -> list[tuple[int, int]]:
    """The order in which a strategy gives up removable units."""
    if strategy == TruncationStrategy.TRUNCATE_LEFT.value:
        return list(spans)
    if strategy == TruncationStrategy.TRUNCATE_RIGHT.value:
        return spans[::-1]
    if strategy == TruncationStrategy.MIDDLE_OUT.value:
        middle = (len(spans) - 1) / 2
        return [spans[j] for j in sorted(range(len(spans)), key=lambda j: (abs(j - middle), j))]
    if strategy == "error":
        return []
    raise ValueError(f"unknown truncation strategy {strategy!r}; expected one of {', '.join(TRUNCATIONS)}")


def fit_messages(
    messages: Sequence[Message],
    counts: Sequence[int],
    *,
    budget: int,
    target: int,
    strategy: str,
    pin_first_user: bool = True,
    fixed_tokens: int = 0,
    counter: Counter | None = None,
    note_role: str = NOTE_ROLE,
) -> Fit:
    """Remove whole units, in the strategy's order, until the request is within `target`.

    Removes nothing when already within `target`, and the fewest units that reach it
    otherwise. When even removing every removable unit leaves it over `budget`, the
    result has `fits=False` and everything removable removed: the caller then cuts
    oversized messages or refuses the request.
    """
    if len(counts) != len(messages):
        raise ValueError(f"{len(counts)} counts for {len(messages)} messages")
    order = removal_order(removable_units(messages, pin_first_user), strategy)
    keep = [True] * len(messages)
    tokens = sum(counts) + fixed_tokens
    if tokens <= target:
        return Fit(keep, 0, tokens, None, tokens <= budget)
    counter = counter or HeuristicCounter()
    kept_tokens, removed, note = tokens, 0, None
    for start, end in order:
        keep[start:end] = [False] * (end - start)
        removed += end - start
        kept_tokens -= sum(counts[start:end])
        note = omission_note(removed, note_role)
        tokens = kept_tokens + counter.count_message(note)
        if tokens <= target:
            break
    return Fit(keep, removed, tokens, note, tokens <= budget)


def oversized_limit(usable_window: int, max_message_share: float) -> int:
    """The most tokens one message's text may hold before it is cut (at least 1)."""
    return max(1, int(usable_window * max_message_share))


def cut_oversized(message: Message, counter: Counter, max_tokens: int) -> Message | None:
    """A copy of the message with its text cut to head + marker + tail; None when it fits.

    Only the content text is cut: a tool call's arguments are JSON the client may
    parse back, so a message oversized by its arguments alone is left as it is (None).
    Deterministic, so a replayed turn sends the same bytes and the prompt cache holds.
    """
    text = content_text(message)
    if text is None:
        return None
    total = counter.count_text(text)
    if total <= max_tokens:
        return None
    return {**message, "content": _with_text(message["content"], _head_and_tail(text, total, counter, max_tokens))}


def _head_and_tail(text: str, total: int, counter: Counter, max_tokens: int) -> str:
    """About half the allowance from each end, shrunk until the whole fits `max_tokens`."""
    marker_tokens = counter.count_text(CUT_MARKER.format(n=total)) + 2
    side = max(0, max_tokens - marker_tokens) // 2
    chars = len(text) * side // total
    while True:
        head, tail = _head(text, chars), _tail(text, chars)
        cut = max(1, total - counter.count_text(head) - counter.count_text(tail))
        result = "\n".join(part for part in (head, CUT_MARKER.format(n=cut), tail) if part)
        if chars == 0 or counter.count_text(result) <= max_tokens:
            return result
        chars = chars * 9 // 10


def _head(text: str, chars: int) -> str:
    """The first `chars` characters, ending at a line break when one is near the end."""
    piece = text[:chars]
    newline = piece.rfind("\n")
    return piece[:newline] if newline >= chars * 4 // 5 else piece


def _tail(text: str, chars: int) -> str:
    """The last `chars` characters, starting after a line break when one is near the start."""
    piece = text[len(text) - chars :]
    newline = piece.find("\n")
    return piece[newline + 1 :] if 0 <= newline < chars // 5 else piece


def _with_text(content: Any, text: str) -> Any:
    """The content with its text replaced: a string, or the first text part (other text parts dropped)."""
    if isinstance(content, str):
        return text
    out: list[Any] = []
    placed = False
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            if not placed:
                out.append({**part, "text": text})
                placed = True
            continue
        out.append(part)
    return out
