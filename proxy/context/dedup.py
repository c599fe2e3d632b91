"""Identical tool outputs: the second one is sent as a one-line reference to the first.

Agents re-run the same command and get the same bytes back; sending them again costs
their tokens on every later turn. A new output is deduplicated as it arrives (that
touches no earlier message, so the cached prefix survives); older duplicates wait
for an edit epoch. The reference is a pure function of the two messages, so a
replayed turn sends the same line again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from proxy.context.messages import Message, content_text
from proxy.context.stamps import unstamped

# Below this many tokens a body is cheaper to repeat than to point at.
MIN_TOKENS = 40


def body_digest(message: Message) -> bytes | None:
    """A digest of the output's text alone (not its call id, nor the stamps a tool puts on each run:
    `proxy.context.stamps`), or None when it has no plain text, or anything beside its text (two screenshots
    read the same as text: only their bytes say whether they are the same)."""
    text = content_text(message)
    content = message.get("content")
    if text is None or (
        isinstance(content, list) and any(not isinstance(p, dict) or p.get("type") != "text" for p in content)
    ):
        return None
    return hashlib.blake2b(unstamped(text).encode(), digest_size=16).digest()


def reference(target: Message) -> str:
    """The line that replaces a duplicate of `target`."""
    call = target.get("tool_call_id")
    if target.get("role") == "tool" and call:
        return f"[same output as call {call} above]"
    return "[same output as an earlier message above]"


def with_reference(message: Message, line: str) -> Message:
    return {**message, "content": line}


def duplicates(messages: Sequence[Message], candidates: Sequence[int], tokens: Sequence[int]) -> dict[int, int]:
    """For each candidate whose body equals an earlier candidate's: its index -> that earlier index.

    `tokens[i]` is the size of `messages[i]`; bodies under `MIN_TOKENS` are left alone.
    """
    first: dict[bytes, int] = {}
    found: dict[int, int] = {}
    for i in candidates:
        body = body_digest(messages[i])
        if body is None:
            continue
        if body in first and tokens[i] >= MIN_TOKENS:
            found[i] = first[body]
        else:
            first.setdefault(body, i)
    return found
