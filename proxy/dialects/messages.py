"""Anthropic Messages (`POST /v1/messages`): blocks mapped to engine messages and back.

- `system` (string or blocks) is one engine message the engine never edits.
- A user message with N `tool_result` blocks is N engine `tool` messages (clearing, dedup and
  cuts target them; is_error results read as errors, so short ones stay) plus one `user` message
  for its other blocks; rendering regroups them into one message, blocks in their order.
- An assistant message is one engine message: its `tool_use` blocks are its tool calls, so a
  call and its results go or stay together. One holding thinking, redacted thinking or a block
  type this adapter does not know is opaque: never edited, dropped only whole.
- A message of any other role (`system` mid-conversation, with the beta that allows it) is one engine
  `system` message: counted toward the window, never edited, cleared, cut or dropped.
- A message the engine left alone goes as the client sent it, unknown fields and all. A body whose
  shape this adapter does not map (a role or content of another type) goes upstream as sent: the
  upstream, not the proxy, judges what it accepts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.context.messages import content_text
from proxy.context.pipeline import Overflow
from proxy.dialects.base import (
    HOUR_WRITE_FACTOR,
    Conversation,
    Message,
    Usage,
    continued,
    group_digest,
    keeps_media,
    kept_json,
    opaque,
    whole_count,
    with_media,
)
from proxy.dialects.blocks import TOOL_RESULT, TOOL_USE, blocks_text, content_blocks, media_tokens, unmodelled
from proxy.dialects.body_checks import json_body
from proxy.dialects.breakpoints import last_is_one_hour, with_breakpoints
from proxy.errors import InvalidRequest, anthropic_error_body

ONE_MILLION = 1_000_000  # the window Anthropic's 1M-context beta (and a `[1m]` model id) enables
SYSTEM = -1  # the group of the engine message made from `system`
_PLAIN = frozenset({"text", "image", TOOL_USE})  # block types an assistant or user text message may hold editably
_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens")
Span = tuple[int, int]  # engine messages `start` to `end`: what one client message maps to
_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
}  # fmt: skip


def _stripped(block: Any) -> Any:
    """A block as the journal keys it: without `cache_control`, which clients move every turn."""
    if isinstance(block, dict) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def _validate(body: Any) -> dict[str, Any]:
    """Only what the proxy cannot forward is refused here: anything else the upstream judges (`blocks.unmodelled`)."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", None, "invalid_body")
    return body


ERROR_PREFIX = "Error: "  # what an is_error result reads as to the engine: the engine's word, never the upstream's


def _prefixed(block: Mapping[str, Any], text: str) -> bool:
    """Whether the engine reads this tool_result with `ERROR_PREFIX` put in front of its text."""
    return block.get("is_error") is True and not text.lstrip().lower().startswith("error")


def _tool_message(block: dict[str, Any]) -> Message:
    """A tool_result as the engine reads it: its text, and the tokens of its images and PDFs beside it (so a
    screenshot stays clearable, and leaves the count when it is cleared)."""
    content = block.get("content")
    text = blocks_text(content_blocks(content)) if isinstance(content, str | list) else ""
    if _prefixed(block, text):
        text = ERROR_PREFIX + text  # the engine keeps short errors; it knows them by their words
    return {
        "role": "tool",
        "tool_call_id": str(block.get("tool_use_id", "")),
        "content": with_media(text, media_tokens([block])),
    }


def _tool_result_content(block: Mapping[str, Any], message: Message) -> str | list[Any]:
    """An edited tool_result's content as the upstream gets it: the engine's text without the prefix
    `_tool_message` put there, and the client's images and PDFs when the edit kept them (a cut)."""
    content = block.get("content")
    text = blocks_text(content_blocks(content)) if isinstance(content, str | list) else ""
    new = _new_text(message)
    new = new.removeprefix(ERROR_PREFIX) if _prefixed(block, text) else new
    if not keeps_media(message) or not isinstance(content, list):
        return new
    return [{"type": "text", "text": new}, *(b for b in content if isinstance(b, dict) and b.get("type") != "text")]


def _split_user(blocks: list[Any]) -> list[tuple[list[int], Message]]:
    """A user message: one engine `tool` message per tool_result, then one `user` message for the rest."""
    out: list[tuple[list[int], Message]] = []
    rest = []
    for j, block in enumerate(blocks):
        if block.get("type") == TOOL_RESULT:
            out.append(([j], _tool_message(block)))
        else:
            rest.append(j)
    if rest:
        mine = [blocks[j] for j in rest]
        editable = all(b.get("type") in _PLAIN for b in mine) and any(b.get("type") == "text" for b in mine)
        text, media = blocks_text(mine), media_tokens(mine)
        out.append((rest, {"role": "user", "content": with_media(text, media) if editable else opaque(text, media)}))
    return out


def _assistant(blocks: list[Any]) -> Message:
    calls = [
        {"id": str(b.get("id", "")), "type": "function",
         "function": {"name": str(b.get("name", "")), "arguments": orjson.dumps(b.get("input")).decode()}}
        for b in blocks if b.get("type") == TOOL_USE
    ]  # fmt: skip
    text = blocks_text(blocks)
    editable = all(b.get("type") in _PLAIN for b in blocks)
    message: Message = {"role": "assistant", "content": (text or None) if editable else opaque(text)}
    if calls:
        message["tool_calls"] = calls
    return message


def _other(blocks: list[Any]) -> Message:
    """A message of a role this adapter does not edit (a mid-conversation `system` message): counted, never
    edited, and as a system message never dropped."""
    return {"role": "system", "content": opaque(blocks_text(blocks), media_tokens(blocks))}


def _edited_blocks(blocks: list[Any], indices: list[int], message: Message) -> dict[int, Any]:
    """Blocks of an edited user or assistant group: the first text block takes the new text, other text goes;
    images go too when the edit took them out of the count (a clearing; a cut keeps them)."""
    out: dict[int, Any] = {}
    new = _new_text(message)
    media = keeps_media(message)
    texts = [j for j in indices if blocks[j].get("type") == "text"]
    for j in indices:
        if j not in texts:
            if media or blocks[j].get("type") != "image":
                out[j] = blocks[j]
        elif j == texts[0]:
            out[j] = {**blocks[j], "text": new}
    return out


def _new_text(message: Message) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else (content_text(message) or "")


def _continued(made_from: list[bytes], previous: Sequence[Conversation]) -> tuple[Conversation | None, list[Span]]:
    """The conversation this body's messages (`made_from`, each one's JSON) continue: the first of `previous` made
    from the same first message; and for each message it was made from, its engine messages (`start`, `end`)."""
    prior = continued(made_from, previous)
    if prior is None:
        return None, []
    groups, spans, k = prior.groups, [], 0
    while k < len(groups) and groups[k][0] == SYSTEM:
        k += 1
    for i in range(len(prior.made_from)):
        start = k
        while k < len(groups) and groups[k][0] == i:
            k += 1
        spans.append((start, k))
    return prior, spans


class MessagesDialect:
    """Anthropic's Messages API."""

    name = "messages"
    upstream_path = "messages"

    def parse(self, raw: bytes) -> dict[str, Any]:
        return _validate(json_body(raw))

    def unedited_reason(self, body: Mapping[str, Any]) -> str | None:
        where = unmodelled(body)
        return f"unmodelled: {where}" if where else None

    def conversation(
        self,
        body: Mapping[str, Any],
        digests: list[bytes] | None = None,
        previous: Sequence[Conversation] = (),
        sealed_scale: float = 1.0,  # no sealed parts in this API
    ) -> Conversation:
        messages: list[Message] = []
        groups: list[tuple[int, list[int]]] = []
        keys: list[bytes] = []
        system = body.get("system")
        if system:
            messages.append({"role": "system", "content": opaque(blocks_text(content_blocks(system)))})
            groups.append((SYSTEM, []))
            keys.append(group_digest(["system", [_stripped(b) for b in content_blocks(system)]]))
        made_from = (  # each message's exact JSON (`true` is not `1` here), the body memo's when it read the body
            digests
            if digests is not None and len(digests) == len(body["messages"])
            else [kept_json(message) for message in body["messages"]]
        )
        prior, spans = _continued(made_from, previous)
        count, i = len(body["messages"]), 0
        limit = min(len(spans), count)  # spans: one per message of the conversation continued (none without one)
        while i < count:
            run = i  # a run of messages with the same bytes as those they continue: their engine messages in one go
            while prior is not None and run < limit and prior.made_from[run] == made_from[run]:
                run += 1
            if prior is not None and run > i:
                start, end = spans[i][0], spans[run - 1][1]
                messages += prior.messages[start:end]
                groups += prior.groups[start:end]
                keys += prior.digests[start:end]
                i = run
                continue
            message = body["messages"][i]
            blocks = content_blocks(message["content"])
            role = message["role"]
            if role == "user":
                parts = _split_user(blocks)
            else:
                parts = [(list(range(len(blocks))), _assistant(blocks) if role == "assistant" else _other(blocks))]
            for indices, engine in parts:
                messages.append(engine)
                groups.append((i, indices))
                keys.append(group_digest([role, engine["role"], [_stripped(blocks[j]) for j in indices]]))
            i += 1
        hour = last_is_one_hour(dict(body))
        return Conversation(
            messages=messages,
            digests=keys,
            tools=body.get("tools"),
            max_output_tokens=whole_count(body.get("max_tokens")),
            model=str(body.get("model") or ""),
            groups=groups,
            cache_write_factor=HOUR_WRITE_FACTOR if hour else None,
            cache_ttl_s=3600 if hour else None,
            marked_cache=True,
            made_from=made_from,
        )

    def render(
        self, body: Mapping[str, Any], conversation: Conversation, out: Sequence[Message], sources: Sequence[int]
    ) -> dict[str, Any]:
        originals, groups, engine = body["messages"], conversation.groups, conversation.messages
        sent: dict[int, list[tuple[int, Message]]] = {}  # message index -> its engine messages sent, in order
        touched: set[int] = set()
        order: list[int | dict[str, Any]] = []  # message indices in output order, or inserted messages
        for message, source in zip(out, sources, strict=True):
            if source < 0:
                order.append({"role": "user", "content": [{"type": "text", "text": _new_text(message)}]})
                continue
            i = groups[source][0]
            if i == SYSTEM:
                continue
            if i not in sent:
                sent[i] = []
                order.append(i)
            sent[i].append((source, message))
            if message is not engine[source]:
                touched.add(i)
        totals: dict[int, int] = {}  # message index -> how many engine messages it maps to
        for i, _ in groups:
            totals[i] = totals.get(i, 0) + 1
        result: list[dict[str, Any]] = []
        for item in order:
            if isinstance(item, dict):
                result.append(item)  # its own user message: the API joins consecutive user messages
                continue
            if item not in touched and len(sent[item]) == totals[item]:
                result.append(originals[item])  # all of it sent as the client sent it
                continue
            blocks = content_blocks(originals[item]["content"])
            kept: dict[int, Any] = {}  # block index -> block
            for source, message in sent[item]:
                indices = groups[source][1]
                if message is engine[source]:
                    kept.update((j, blocks[j]) for j in indices)
                elif message.get("role") == "tool":
                    block = blocks[indices[0]]
                    kept[indices[0]] = {**block, "content": _tool_result_content(block, message)}
                else:
                    kept.update(_edited_blocks(blocks, indices, message))
            if kept:
                result.append({**originals[item], "content": [kept[j] for j in sorted(kept)]})
        return {**body, "messages": result}

    def session_hints(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> Sequence[Any]:
        metadata = body.get("metadata")
        return (
            headers.get("x-claude-code-session-id"),
            metadata.get("user_id") if isinstance(metadata, dict) else None,
        )

    def with_usage_requested(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        return body, False  # every Messages answer reports usage

    def with_session(self, body: dict[str, Any], session_id: str) -> dict[str, Any]:
        return body  # Anthropic's cache is addressed by breakpoints, not by a key

    def with_cache_breakpoints(self, body: dict[str, Any], place: bool) -> dict[str, Any]:
        return with_breakpoints(body, place)

    def usage(self, payloads: Sequence[Mapping[str, Any]]) -> Usage | None:
        """`message_start` then `message_delta` (the later, when it has the input counts, wins), or the JSON body.

        `cache_creation` splits the writes by TTL; a later payload without it keeps the earlier one's split.
        """
        found: Usage | None = None
        hour = 0
        for payload in payloads:
            message = payload.get("message")
            usage = (message if isinstance(message, dict) else payload).get("usage")
            if not isinstance(usage, dict) or whole_count(usage.get("input_tokens")) is None:
                continue
            read = whole_count(usage.get("cache_read_input_tokens")) or 0
            written = whole_count(usage.get("cache_creation_input_tokens")) or 0
            split = usage.get("cache_creation")
            if isinstance(split, dict):
                hour = whole_count(split.get("ephemeral_1h_input_tokens")) or 0
            found = Usage(usage["input_tokens"] + read + written, read, written, min(hour, written))
        return found

    def stream_undecided(self, head: bytes) -> bool:
        return False  # Messages refuses with a 400 before any stream begins

    def overflow_tokens(self, status: int, body: bytes) -> int | None:
        if status != 400:
            return None
        try:
            error = orjson.loads(body).get("error") or {}
        except (orjson.JSONDecodeError, AttributeError):
            return None
        match = _TOO_LONG.search(str(error.get("message", ""))) if isinstance(error, dict) else None
        return int(match.group(1)) if match else None

    def error_body(self, message: str, status: int, code: str | None, param: str | None) -> bytes:
        return anthropic_error_body(message, _ERROR_TYPES.get(status, "api_error"))

    def overflow_message(self, overflow: Overflow) -> str:
        """Anthropic's words, which Claude Code parses: the input alone too long, or with `max_tokens` (it then
        lowers `max_tokens` and sends again)."""
        prompt, reserve, window = overflow.prompt_tokens, overflow.reserve, overflow.window
        if prompt > window or reserve <= 0:
            return f"prompt is too long: {prompt} tokens > {window} maximum"
        return (
            f"input length and `max_tokens` exceed context limit: {prompt} + {reserve} > {window}, "
            "decrease input length or `max_tokens` and try again"
        )

    def requested_window(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> int | None:
        """1,000,000 tokens when the request enables them: the `context-1m-*` beta, or a `[1m]` model id."""
        beta = str(headers.get("anthropic-beta") or "")
        model = body.get("model")
        if "context-1m-" in beta or (isinstance(model, str) and model.lower().endswith("[1m]")):
            return ONE_MILLION
        return None


MESSAGES = MessagesDialect()
