"""Chat completions (`POST /v1/chat/completions`): the engine's own model, so the adapter is the identity."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.context.messages import message_digest
from proxy.dialects.base import Conversation, Message, OpenAIWords, Usage, cached_usage, retention_ttl, whole_count
from proxy.dialects.body_checks import parse_chat_body
from proxy.errors import error_body

# How upstreams state the size of a prompt they refuse, most specific first (OpenAI's, vLLM's, Anthropic's wording).
_OVERFLOW_PATTERNS = (
    re.compile(r"resulted in (\d+) tokens"),
    re.compile(r"\((\d+) in the messages"),
    re.compile(r"requested (\d+) tokens"),
    re.compile(r"prompt is too long: (\d+) tokens"),
    re.compile(r"(\d+) (?:input|prompt) tokens"),
)
# Else any "N tokens" not said of the limit ("maximum context length is N tokens", "a limit of N tokens").
_TOKENS = re.compile(r"(\d+) tokens")
_LIMIT_WORDS = re.compile(r"(?:maximum|max|limit|context length|context window|window)\W+(?:\w+\W+){0,2}$", re.I)


def stated_prompt_tokens(message: str) -> int | None:
    """The prompt size a refusal for length states, or None when it states only the limit (or nothing)."""
    for pattern in _OVERFLOW_PATTERNS:
        if match := pattern.search(message):
            return int(match.group(1))
    sizes = [int(m.group(1)) for m in _TOKENS.finditer(message) if not _LIMIT_WORDS.search(message[: m.start()])]
    return max(sizes) if sizes else None


def overflow_tokens(error_body: bytes) -> int | None:
    """The prompt size an upstream `context_length_exceeded` error reports, if it is one."""
    try:
        error = orjson.loads(error_body).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return None
    message = error.get("message") if isinstance(error, dict) else None
    if error.get("code") != "context_length_exceeded" or not isinstance(message, str):
        return None
    return stated_prompt_tokens(message)


def max_output_tokens(body: Mapping[str, Any], keys: Sequence[str]) -> int | None:
    """The completion allowance the request names under the first of `keys` it has, if any."""
    for key in keys:
        if value := whole_count(body.get(key)):
            return value
    return None


class ChatDialect(OpenAIWords):
    """OpenAI chat completions: messages are engine messages, one each."""

    name = "chat"
    upstream_path = "chat/completions"

    def parse(self, raw: bytes) -> dict[str, Any]:
        return parse_chat_body(raw)

    def unedited_reason(self, body: Mapping[str, Any]) -> str | None:
        return None

    def conversation(
        self,
        body: Mapping[str, Any],
        digests: list[bytes] | None = None,
        previous: Sequence[Conversation] = (),
        sealed_scale: float = 1.0,  # no sealed parts in this API
    ) -> Conversation:
        messages = body["messages"]
        if digests is None or len(digests) != len(messages):
            digests = [message_digest(m) for m in messages]
        return Conversation(
            messages=messages,
            digests=digests,
            tools=body.get("tools"),
            max_output_tokens=max_output_tokens(body, ("max_completion_tokens", "max_tokens")),
            model=str(body.get("model") or ""),
            cache_ttl_s=retention_ttl(body),
        )

    def render(
        self, body: Mapping[str, Any], conversation: Conversation, out: Sequence[Message], sources: Sequence[int]
    ) -> dict[str, Any]:
        return {**body, "messages": list(out)}

    def session_hints(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> Sequence[Any]:
        metadata = body.get("metadata")
        return (metadata.get("session_id") if isinstance(metadata, dict) else None,)

    def with_session(self, body: dict[str, Any], session_id: str) -> dict[str, Any]:
        return body

    def with_cache_breakpoints(self, body: dict[str, Any], place: bool) -> dict[str, Any]:
        return body  # OpenAI caches every prefix by itself

    def with_usage_requested(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """A stream asks for the usage chunk; one the client did not ask for itself is dropped before it sees it."""
        if body.get("stream") is not True:
            return body, False
        options = body.get("stream_options")
        options = options if isinstance(options, dict) else {}
        if options.get("include_usage") is True:
            return body, False
        return {**body, "stream_options": {**options, "include_usage": True}}, True

    def usage(self, payloads: Sequence[Mapping[str, Any]]) -> Usage | None:
        for payload in reversed(payloads):
            if usage := cached_usage(payload.get("usage"), "prompt_tokens", "prompt_tokens_details"):
                return usage
        return None

    def stream_undecided(self, head: bytes) -> bool:
        return False  # chat refuses with a 400 before any stream begins

    def overflow_tokens(self, status: int, body: bytes) -> int | None:
        return overflow_tokens(body) if status == 400 else None

    def error_body(self, message: str, status: int, code: str | None, param: str | None) -> bytes:
        return error_body(message, status, code, param)


CHAT = ChatDialect()
