"""How the pure engine counts tokens: any object with these two methods will do.

The proxy passes a tiktoken-backed counter (`proxy.tokens.counter.TokenCounter`); tests and
the seed types default to the heuristic one, as the seeds' `HeuristicTokenCounter`.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

# OpenAI's chat framing: each message costs 3 tokens, a `name` one more, and the
# reply is primed with 3 (the OpenAI cookbook's count for current chat models).
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3


class Counter(Protocol):
    def count_text(self, text: str) -> int: ...

    def count_message(self, message: dict[str, Any], digest: bytes | None = None) -> int:
        """`digest`, when the caller has it, is the message's `message_digest` (a cache may key on it)."""
        ...


def message_text(message: dict[str, Any]) -> str:
    """Every string of a message that the model reads, joined, for counting."""
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                text = part.get("text") or part.get("refusal")
                if isinstance(text, str):
                    parts.append(text)
    for key in ("role", "name", "refusal"):
        value = message.get(key)
        if isinstance(value, str):
            parts.append(value)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                parts.append(str(function.get("name", "")))
                parts.append(str(function.get("arguments", "")))
    return "\n".join(parts)


def stated_tokens(message: dict[str, Any]) -> int:
    """Tokens a dialect stated for content the engine cannot read (an opaque part's `tokens`)."""
    content = message.get("content")
    if not isinstance(content, list):
        return 0
    return sum(
        p["tokens"] for p in content if isinstance(p, dict) and isinstance(p.get("tokens"), int) and p["tokens"] > 0
    )


def framing(message: dict[str, Any]) -> int:
    """Tokens the chat template adds around one message."""
    extra = TOKENS_PER_NAME if message.get("name") else 0
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        extra += 3 * len(calls)
    return TOKENS_PER_MESSAGE + extra


class HeuristicCounter:
    """About four characters a token: cheap, deterministic, dependency-free."""

    def count_text(self, text: str) -> int:
        return (len(text) + 3) // 4

    def count_message(self, message: dict[str, Any], digest: bytes | None = None) -> int:
        return self.count_text(message_text(message)) + framing(message) + stated_tokens(message)


def canonical_bytes(value: Any) -> bytes:
    """One byte form per JSON value (sorted keys), for hashing and cache keys."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
