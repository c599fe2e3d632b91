"""Chat messages as the engine sees them: digests, stable ids, tool outputs, errors."""

from __future__ import annotations

import hashlib
import sys
from collections import Counter as Tally
from collections.abc import Sequence
from typing import Any

import orjson

from proxy.context.patterns import Pattern
from proxy.context.tokens import canonical_bytes

Message = dict[str, Any]
INSTRUCTION_ROLES = ("system", "developer")
PART_BYTES = 250  # a content part's dict, beside its text


def newest(messages: Sequence[Message]) -> int:
    """The index of the newest message, the one the agent has not read yet: the last, past the instructions that
    follow it (Claude Code sends a system reminder after the newest tool results); -1 when there is none."""
    i = len(messages) - 1
    while i > 0 and messages[i].get("role") in INSTRUCTION_ROLES:
        i -= 1
    return i


def message_digest(message: Message) -> bytes:
    """16 bytes that change whenever anything the client sent in the message changes.

    SHA-256, cut to 16 bytes: with the CPU's SHA instructions it hashes a long conversation in
    about two thirds of blake2b's time, and every message of every request is hashed.
    """
    return hashlib.sha256(canonical_bytes(message)).digest()[:16]


def message_ids(messages: Sequence[Message], digests: Sequence[bytes] | None = None) -> list[str]:
    """A stable id per message: its digest and which occurrence of that digest it is.

    Appending messages never changes an earlier id, so a plan made by id still
    applies once the conversation has grown (positions alone would not survive an
    edit, and tool_call ids are reused by some agents).
    """
    seen: dict[bytes, int] = {}
    out = []
    for i, message in enumerate(messages):
        digest = digests[i] if digests is not None else message_digest(message)
        n = seen.get(digest, 0)
        seen[digest] = n + 1
        out.append(f"{digest.hex()}:{n}")
    return out


def ids_at(digests: Sequence[bytes], indices: Sequence[int]) -> list[str]:
    """`message_ids(messages, digests)` at `indices` only: each id made, not every message's (the ids of a
    plan's few outputs in a long conversation)."""
    wanted = {digests[i] for i in indices}
    at = set(indices)
    seen: dict[bytes, int] = {}
    found: dict[int, str] = {}
    for i, digest in enumerate(digests):
        if digest in wanted:
            n = seen.get(digest, 0)
            seen[digest] = n + 1
            if i in at:
                found[i] = f"{digest.hex()}:{n}"
    return [found[i] for i in indices]


def indices_of(ids: Sequence[str], digests: Sequence[bytes]) -> list[int]:
    """Where the messages of `digests` have one of the `message_ids` `ids`, in order: the digests are compared, and
    only a wanted one's occurrences counted."""
    wanted: dict[bytes, set[int]] = {}
    for mid in ids:
        text, _, number = mid.partition(":")
        try:
            digest, occurrence = bytes.fromhex(text), int(number)
        except ValueError:
            continue  # no message has such an id
        if mid == f"{digest.hex()}:{occurrence}":  # as `message_ids` writes it (lower-case hex, no leading zeros)
            wanted.setdefault(digest, set()).add(occurrence)
    seen: dict[bytes, int] = {}
    found = []
    for i, digest in enumerate(digests):
        occurrences = wanted.get(digest)
        if occurrences is not None:
            n = seen.get(digest, 0)
            seen[digest] = n + 1
            if n in occurrences:
                found.append(i)
    return found


def content_text(message: Message) -> str | None:
    """The message's text when its content is a string or a list of text parts; else None."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        strings = [t for t in texts if isinstance(t, str)]
        if texts and len(strings) == len(texts):
            return "\n".join(strings)
    return None


def is_tool_output(message: Message, observation_patterns: Sequence[Pattern] = ()) -> bool:
    """A `tool` message, or a `user` message an observation pattern marks as tool output."""
    role = message.get("role")
    if role in ("tool", "function"):
        return True
    if role == "user" and observation_patterns:
        text = content_text(message)
        return text is not None and any(p.search(text) for p in observation_patterns)
    return False


def is_error_output(text: str, error_patterns: Sequence[Pattern]) -> bool:
    """Text that reports a failure: matches an error pattern, or a JSON object with a top-level `error`."""
    if any(p.search(text) for p in error_patterns):
        return True
    stripped = text.lstrip()
    if stripped.startswith("{") and '"error"' in stripped:
        try:
            value = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            return False
        return isinstance(value, dict) and "error" in value
    return False


def tool_names(messages: Sequence[Message]) -> dict[int, str]:
    """For each tool result's index, the name of the function whose call it answers."""
    names: dict[str, str] = {}
    out: dict[int, str] = {}
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and isinstance(calls, list):
            for call in calls:
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    names[str(call.get("id"))] = str(call["function"].get("name", ""))
        elif message.get("role") == "tool":
            name = names.get(str(message.get("tool_call_id")))
            if name is not None:
                out[i] = name
    return out


def call_ids(message: Message) -> list[str]:
    """The ids of an assistant message's tool calls, in order ([] when it calls nothing)."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not isinstance(calls, list):
        return []
    return [str(call.get("id")) for call in calls if isinstance(call, dict)]


def units(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """The [start, end) spans that must be removed or kept together.

    An assistant message with tool calls and the tool messages right after it that
    answer those calls form one unit; any other message is its own. Pairing is by
    position, not a global id map, because real agents reuse tool_call ids across turns.
    """
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(messages):
        pending = Tally(call_ids(messages[i]))  # by id, so results in any order pair in linear time
        end = i + 1
        while pending and end < len(messages) and messages[end].get("role") == "tool":
            answered = str(messages[end].get("tool_call_id"))
            if not pending[answered]:
                break
            pending[answered] -= 1
            if not pending[answered]:
                del pending[answered]
            end += 1
        if _legacy_call(messages[i]) and end < len(messages) and messages[end].get("role") == "function":
            end += 1  # the deprecated function_call and its `function` result go together too
        spans.append((i, end))
        i = end
    return spans


def _legacy_call(message: Message) -> bool:
    return message.get("role") == "assistant" and isinstance(message.get("function_call"), dict)


def content_bytes(content: Any) -> int:
    """What a content holds in memory: its strings (their own size, as Python keeps them) and a little a part."""
    if isinstance(content, str):
        return sys.getsizeof(content)
    if isinstance(content, list):
        return sum(PART_BYTES + content_bytes(part.get("text")) for part in content if isinstance(part, dict))
    return 0
