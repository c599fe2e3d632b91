"""The seam between an API dialect and the one context engine (SPEC §7).

The engine works on one conversation model: chat-completions-shaped "engine messages"
(`role`, `content`, `tool_calls`, `tool_call_id`). Each API is an adapter that maps its
request to that model and renders the engine's decisions back into its own bytes, so a
new API is a new adapter and nothing else. Adapters are pure: data in, data out.

What the engine may do to an engine message: keep it, replace its `content` (clear,
dedup, cut), drop it (a call goes with its results), or insert new messages (capsules,
omission notes). A message whose `content` is a list with no part of type `text` is never
cut, cleared or deduplicated: adapters encode what must stay byte-identical that way
(`opaque`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import orjson

from proxy.context.economics import input_cost_usd
from proxy.context.pipeline import Overflow
from proxy.context.policy import ModelInfo
from proxy.context.tokens import canonical_bytes

Message = dict[str, Any]
HOUR_WRITE_FACTOR = 2.0  # Anthropic bills a cache write kept for 1 hour at twice the input price


def writes_at(model: ModelInfo, factor: float) -> ModelInfo:
    """The model with cache writes at `factor` times its input price (the table's is Anthropic's 5-minute one)."""
    return replace(model, cache_write_per_mtok=factor * model.input_per_mtok)


@dataclass(frozen=True, slots=True)
class Usage:
    """What the upstream billed for one request's input, in one form for every API."""

    prompt: int  # every input token billed (Anthropic: input + cache writes + cache reads)
    cached: int = 0  # read from the prompt cache, at the cached price
    written: int = 0  # written to the prompt cache (Anthropic), at the write price
    written_1h: int = 0  # of `written`, what is kept for 1 hour (Anthropic's `ttl: "1h"`), at twice the input price

    def cost_usd(self, model: ModelInfo) -> float:
        """What this input cost at `model`'s prices, 1-hour cache writes at the 1-hour price."""
        hour = min(self.written_1h, self.written)
        rest = input_cost_usd(model, self.prompt - hour, self.cached, self.written - hour)
        if not hour:  # the usual case: no model re-priced per usage record
            return rest
        return rest + input_cost_usd(writes_at(model, HOUR_WRITE_FACTOR), hour, 0, hour)


@dataclass
class Conversation:
    """A request as the engine sees it, with what each engine message was made from."""

    messages: list[Message]
    digests: list[bytes]  # one per engine message, over the client's own bytes of its group
    tools: Any = None  # counted toward the window, whatever its shape
    max_output_tokens: int | None = None
    model: str = ""
    groups: list[Any] = field(default_factory=list)  # adapter-private, one per engine message
    # The client asked for cache writes at this multiple of the input price (Anthropic's 1-hour TTL: 2); None: the
    # model table's write price. The epoch rule prices the re-written tail by it.
    cache_write_factor: float | None = None
    # The client asked the upstream to keep its prefix this long, in seconds (Anthropic's 1-hour mark on the last
    # breakpoint: 3600; OpenAI's `prompt_cache_retention: "24h"`: 86400); None: the model table's `cache_ttl_s`.
    cache_ttl_s: int | None = None
    # The API reads a cached prefix only where the request marks one (Anthropic), not at any prefix.
    marked_cache: bool = False
    # The body's own messages it was mapped from (Messages): a later body's equal messages take their engine
    # messages from here (`Dialect.conversation`'s `previous`). Never changed.
    made_from: Sequence[Any] = ()
    # Some message carries a sealed part (`opaque`'s `sealed`): what the upstream bills for it is learned (Responses).
    sealed: bool = False


def retention_ttl(body: Mapping[str, Any]) -> int | None:
    """OpenAI's extended prompt cache retention, asked for in the body: a prefix kept up to 24 hours."""
    return 86400 if body.get("prompt_cache_retention") == "24h" else None


def kept_json(value: Any) -> bytes:
    """`value`'s JSON, as bytes of just its size, to keep: orjson leaves the buffer of what it returns over-allocated
    (4 KB for a short value, ~1.5x for a long one), which a kept one would hold for as long as it is kept."""
    return memoryview(orjson.dumps(value)).tobytes()


def continued(made_from: Sequence[bytes], previous: Sequence[Conversation]) -> Conversation | None:
    """The conversation a body continues: the first of `previous` made from the same first piece (`made_from`, each
    piece's `kept_json`: a Messages message, a Responses input group), or None."""
    return next((c for c in previous if made_from and c.made_from and c.made_from[0] == made_from[0]), None)


def group_digest(value: Any) -> bytes:
    """16 bytes that change whenever anything the client sent in `value` changes (the journal's key)."""
    return hashlib.sha256(canonical_bytes(value)).digest()[:16]


def opaque(text: str, tokens: int = 0, sealed: int = 0) -> list[dict[str, Any]]:
    """Content the engine counts by `text` but never edits (reasoning, thinking, a cached system prompt),
    plus `tokens` it cannot read but the model will (images' count, or a sealed reasoning blob's estimate: then
    `sealed` is the estimate before its learned scale, `Calibration.sealed_scale`)."""
    part: dict[str, Any] = {"type": "opaque", "text": text}
    if tokens:
        part["tokens"] = tokens
    if sealed:
        part["sealed"] = sealed
    return [part]


def sealed_parts(messages: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """The tokens the messages' sealed parts are counted at, and their estimate before its scale."""
    counted = unscaled = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("sealed"):
                    counted, unscaled = counted + part.get("tokens", 0), unscaled + part["sealed"]
    return counted, unscaled


MEDIA = "media"  # an engine content part standing for images and files: no text, only the tokens they are billed


def with_media(text: str, tokens: int) -> str | list[dict[str, Any]]:
    """Editable content: `text`, plus the `tokens` its images and files are billed (a part of their own, so a
    clearing that replaces the content takes them out of the count, and a cut that keeps the part keeps them)."""
    return [{"type": "text", "text": text}, {"type": MEDIA, "tokens": tokens}] if tokens else text


def keeps_media(message: Message) -> bool:
    """Whether an engine message still carries its images and files (cut: yes; cleared, deduplicated: no)."""
    content = message.get("content")
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == MEDIA for p in content)


def whole_count(value: Any) -> int | None:
    """A token count from a JSON body: a whole number >= 0 (JSON's true/false are not counts)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def cached_usage(usage: Any, prompt_key: str, details_key: str) -> Usage | None:
    """OpenAI's usage object (a count under `prompt_key`, `cached_tokens` under `details_key`); None without a count."""
    prompt = whole_count(usage.get(prompt_key)) if isinstance(usage, dict) else None
    if prompt is None:
        return None
    details = usage.get(details_key)
    cached = whole_count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return Usage(prompt, min(cached or 0, prompt))


class Dialect(Protocol):
    """One API the proxy rewrites: how its requests map to the engine and back, and how it bills."""

    name: str  # "chat", "responses", "messages": the metrics label and what /sessions shows
    upstream_path: str  # after the upstream's base URL: "chat/completions", "responses", "messages"

    def parse(self, raw: bytes) -> dict[str, Any]:
        """The validated body; raises `proxy.errors.InvalidRequest` for a malformed one."""
        ...

    def unedited_reason(self, body: Mapping[str, Any]) -> str | None:
        """Why this request must go upstream as sent (its history lives on the server); None when it need not."""
        ...

    def conversation(
        self,
        body: Mapping[str, Any],
        digests: list[bytes] | None = None,
        previous: Sequence[Conversation] = (),
        sealed_scale: float = 1.0,
    ) -> Conversation:
        """The engine's view of the request; `digests`, when the shell has them, are its messages' keys as its body
        memo made them (`proxy.service.body_memos.Reading`: chat, each one's digest; Messages, its exact JSON);
        `previous`, conversations this body may continue (the same client and session name's last ones): a dialect
        may take the engine messages of a message equal to one they were made from instead of mapping it again;
        `sealed_scale`, what the upstream bills per token we estimate in a sealed blob (`Calibration.sealed_scale`)."""
        ...

    def render(
        self, body: Mapping[str, Any], conversation: Conversation, out: Sequence[Message], sources: Sequence[int]
    ) -> dict[str, Any]:
        """The body to send: `out[j]` renders engine message `sources[j]` (-1: one the engine inserted).

        `out[j] is conversation.messages[i]`: group i goes as the client sent it; otherwise its content was edited.
        """
        ...

    def session_hints(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> Sequence[Any]:
        """Session ids this API carries, in order of precedence after the path and `X-Session-Id`."""
        ...

    def with_session(self, body: dict[str, Any], session_id: str) -> dict[str, Any]:
        """The body naming its session where the API routes its prompt cache by it (Responses); else `body`."""
        ...

    def with_usage_requested(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """The body asking the upstream to report usage, and whether the client must not see that report."""
        ...

    def with_cache_breakpoints(self, body: dict[str, Any], place: bool) -> dict[str, Any]:
        """The body within the API's breakpoint limit and (`place`) with the proxy's own prompt-cache breakpoints
        (Anthropic's `cache_control`); else `body`."""
        ...

    def usage(self, payloads: Sequence[Mapping[str, Any]]) -> Usage | None:
        """The input usage from a JSON response body, or from every SSE event payload that held usage."""
        ...

    def stream_undecided(self, head: bytes) -> bool:
        """True while the start of a streamed 200 holds only events sent before the API may still refuse.

        The shell reads on (and holds those bytes) until this is False, then asks `overflow_tokens(200, head)`.
        """
        ...

    def overflow_tokens(self, status: int, body: bytes) -> int | None:
        """The prompt size an upstream "context too long" refusal reports (0: too long, size not stated); None
        when it is not one. `status` 200: `body` is the start of a stream (an API that refuses mid-stream)."""
        ...

    def error_body(self, message: str, status: int, code: str | None, param: str | None) -> bytes:
        """An error the proxy answers itself on this API's route, in the API's own shape."""
        ...

    def overflow_message(self, overflow: Overflow) -> str:
        """The words of the proxy's own "too long" refusal, as the API's clients parse them."""
        ...

    def requested_window(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> int | None:
        """A context window the request itself enables beyond the model table's (Anthropic's 1M beta); else None."""
        ...


class OpenAIWords:
    """What OpenAI's APIs (chat, Responses) answer for the methods where they all say the same."""

    def overflow_message(self, overflow: Overflow) -> str:
        return overflow.message()

    def requested_window(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> int | None:
        return None
