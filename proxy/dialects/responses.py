"""OpenAI Responses (`POST /v1/responses`): input items grouped into engine messages, and back.

Codex CLI and the Agents SDK send the whole `input` every turn (`store: false`). Each engine
message is made from a group of items that must stay together:

- `instructions` plays the system message's part;
- a `message` item is a message of its role (its text parts joined; other parts make it opaque);
- consecutive calls (`function_call`, `custom_tool_call`, ... : items with a `call_id`), with the
  assistant text right before them, are one assistant message with `tool_calls`, and each
  `*_call_output` is a `tool` message answering one, so the engine keeps a call and its output together;
- a `reasoning` item goes with the output it preceded (calls or an assistant message), and that
  group is opaque: the engine may drop it whole, never edit it (`encrypted_content` is signed);
- any other item is opaque and goes upstream byte-identical.

An edited group gets its new text written back into its one editable item; every other
group goes as the client sent it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.context.messages import content_text
from proxy.dialects.base import (
    Conversation,
    Message,
    OpenAIWords,
    Usage,
    cached_usage,
    continued,
    group_digest,
    keeps_media,
    opaque,
    retention_ttl,
    with_media,
)
from proxy.dialects.body_checks import json_body
from proxy.dialects.chat import max_output_tokens
from proxy.dialects.responses_groups import Group, grouped, grouped_before, groups_json, is_call, is_output, item_type
from proxy.dialects.responses_refusals import overflow_tokens, stream_undecided
from proxy.errors import InvalidRequest, error_body
from proxy.tokens.media import openai_part_tokens

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
MEDIA_PARTS = ("input_image", "input_file")
# base64 (4 characters per 3 bytes) of sealed text (about 4 bytes a token): ~5.3 characters a reasoning token.
SEALED_CHARS_PER_TOKEN = 5
CODEX_SESSION_HEADERS = ("session-id", "session_id")  # Codex 0.17x sends the first; older ones the second


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """The header `name` (lower case) from aiohttp's headers, or from a plain dict whose keys are as sent."""
    if hasattr(headers, "getall"):
        return headers.get(name)
    return next((v for k, v in headers.items() if k.lower() == name), None)


def _parts_text(parts: Any) -> str | None:
    """A string, or the text of a list made only of text parts; None when anything else is in it."""
    if isinstance(parts, str):
        return parts
    if isinstance(parts, list) and parts:
        texts = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type") in TEXT_PARTS]
        strings = [t for t in texts if isinstance(t, str)]
        if len(strings) == len(parts):
            return "\n".join(strings)
    return None


def _media_parts(parts: Any) -> tuple[str, int] | None:
    """A list of text, image and file parts: its text (a marker for each image or file) and the tokens OpenAI
    bills for the images and files; None when something else is in it, or no image or file."""
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        return None
    texts, tokens = [], 0
    for part in parts:
        if part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif part.get("type") in MEDIA_PARTS:
            texts.append(f"[{part['type'].removeprefix('input_')}]")
            tokens += openai_part_tokens(part)
        else:
            return None
    return ("\n".join(texts), tokens) if tokens else None


def _countable(item: Mapping[str, Any]) -> str:
    """The text an opaque item is counted by: a reasoning item's summary (`_sealed_tokens` counts its blob), else
    its JSON."""
    if item_type(item) == "reasoning":
        summary = item.get("summary")
        texts = [p.get("text") for p in summary if isinstance(p, dict)] if isinstance(summary, list) else []
        return "\n".join(t for t in texts if isinstance(t, str))
    if item_type(item) == "message":
        text = _parts_text(item.get("content"))
        return text if text is not None else orjson.dumps(item.get("content")).decode()
    return orjson.dumps(item).decode()


def _sealed_tokens(items: Sequence[Mapping[str, Any]]) -> int:
    """Our estimate of the reasoning tokens sealed in the items' `encrypted_content`, before its learned scale:
    the upstream may bill the reasoning the blob carries rather than the blob's own characters (base64 of ciphertext
    counts several times more tokens than the text it seals). What it does bill is learned from usage
    (`Calibration.sealed_scale`): a blob is counted at this estimate times that scale."""
    blobs = [item.get("encrypted_content") for item in items if item_type(item) == "reasoning"]
    return sum(len(blob) // SEALED_CHARS_PER_TOKEN for blob in blobs if isinstance(blob, str))


def _said(items: Sequence[Mapping[str, Any]], scale: float) -> list[dict[str, Any]]:
    """Reasoning and text the engine counts but never edits, a sealed blob at its scaled estimate."""
    sealed = _sealed_tokens(items)
    return opaque("\n".join(map(_countable, items)), round(sealed * scale), sealed)


def _call(item: Mapping[str, Any]) -> dict[str, Any]:
    arguments = item.get("arguments", item.get("input", item.get("action")))
    arguments = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    name = item.get("name")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": name or item_type(item), "arguments": arguments},
    }


def _message(group: Group, scale: float = 1.0) -> Message:
    """The engine message a group of items stands for (`scale`: `_said`'s)."""
    items = group.items
    calls = [item for item in items if is_call(item)]
    if calls:
        said = [item for item in items if not is_call(item)]  # its reasoning and text: counted, never edited
        content = _said(said, scale) if said else None
        return {"role": "assistant", "content": content, "tool_calls": [_call(item) for item in calls]}
    if group.editable < 0:
        return {"role": "assistant", "content": _said(items, scale)}
    item = items[group.editable]
    if is_output(item):
        output = item.get("output")
        text = _parts_text(output)
        if text is not None:
            return {"role": "tool", "tool_call_id": item["call_id"], "content": text}
        media = _media_parts(output)  # text and screenshots: clearable, the images' tokens beside the text
        shot = with_media(*media) if media else opaque("", openai_part_tokens(output))  # a computer_screenshot
        return {"role": "tool", "tool_call_id": item["call_id"], "content": shot}
    text = _parts_text(item.get("content"))
    if text is None and (media := _media_parts(item.get("content"))):
        return {"role": item["role"], "content": opaque(*media)}  # a message with images goes as sent
    return {"role": item["role"], "content": text if text is not None else opaque(_countable(item))}


def _edited(group: Group, text: str, media: bool) -> list[Any]:
    """The group's items with `text` written into its editable item, in the shape that item had; its images and
    files kept when the edit kept them in the count (`media`: a cut, not a clearing)."""
    items = list(group.items)
    item = dict(items[group.editable])
    field = "output" if is_output(item) else "content"
    if isinstance(item.get(field), list):
        part_type = "output_text" if item.get("role") == "assistant" else "input_text"
        part: dict[str, Any] = {"type": part_type, "text": text}
        if part_type == "output_text":
            part["annotations"] = []
        kept = [p for p in item[field] if isinstance(p, dict) and p.get("type") in MEDIA_PARTS] if media else []
        item[field] = [part, *kept]
    else:
        item[field] = text
    items[group.editable] = item
    return items


def _check(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", None, "invalid_type")
    items = body.get("input")
    if items is not None and not isinstance(items, str | list):
        raise InvalidRequest(
            "Invalid type for 'input': expected a string or an array of items.", "input", "invalid_type"
        )
    check_input(body, items if isinstance(items, list) else [], 0)
    return body


def check_input(body: dict[str, Any], items: list[Any], offset: int) -> None:
    """Raise InvalidRequest for the first malformed item of `items` (`input[offset:]`), then for `instructions`."""
    for i, item in enumerate(items, offset):
        if not isinstance(item, dict):
            raise InvalidRequest(f"Invalid type for 'input[{i}]': expected an object.", f"input[{i}]", "invalid_type")
        if item_type(item) == "message" and item.get("role") not in ROLES:
            raise InvalidRequest(
                f"Invalid value for 'input[{i}].role': supported values are {', '.join(ROLES)}.",
                f"input[{i}].role",
                "invalid_value",
            )
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str | list):
        raise InvalidRequest("Invalid type for 'instructions': expected a string.", "instructions", "invalid_type")


class ResponsesDialect(OpenAIWords):
    """OpenAI Responses with the whole history in `input` (stateless: Codex CLI, the Agents SDK)."""

    name = "responses"
    upstream_path = "responses"

    def parse(self, raw: bytes) -> dict[str, Any]:
        return _check(json_body(raw))

    def unedited_reason(self, body: Mapping[str, Any]) -> str | None:
        """The history lives on the server (`previous_response_id`, `conversation`) or in a stored prompt."""
        for key in ("previous_response_id", "conversation"):
            if body.get(key):
                return key
        return None if body.get("input") else "no_input"

    def conversation(
        self,
        body: Mapping[str, Any],
        digests: list[bytes] | None = None,
        previous: Sequence[Conversation] = (),
        sealed_scale: float = 1.0,
    ) -> Conversation:
        groups: list[Group] = []
        instructions = body.get("instructions")
        if instructions:
            groups.append(Group("instructions", (instructions,), 0 if isinstance(instructions, str) else -1))
        items = body["input"]
        # Each group's JSON (exact: `true` is not `1` here): a group equal to the one at its place in the conversation
        # this body continues takes that one's engine message and digest again, instead of mapping it anew.
        made_from = groups_json(groups, None)
        if isinstance(items, str):
            groups.append(Group("text", (items,), 0))
            made_from += groups_json(groups[-1:], None)
        else:
            kept, kept_made = grouped_before(items, previous)
            start = sum(len(group.items) for group in kept)
            new = grouped(items[start:])
            keys = digests[start:] if digests is not None and len(digests) == len(items) else None
            groups += kept + new
            made_from += kept_made + groups_json(new, keys)
        prior = continued(made_from, previous)
        known = prior.made_from if prior is not None else ()
        messages, digests = [], []
        for j, group in enumerate(groups):
            if prior is not None and j < len(known) and known[j] == made_from[j]:
                messages.append(prior.messages[j])
                digests.append(prior.digests[j])
            else:
                messages.append(self._message(group, sealed_scale))
                digests.append(group_digest([group.kind, *group.items]))
        return Conversation(
            messages=messages,
            digests=digests,
            tools=body.get("tools"),
            max_output_tokens=max_output_tokens(body, ("max_output_tokens",)),
            model=str(body.get("model") or ""),
            groups=groups,
            cache_ttl_s=retention_ttl(body),
            made_from=made_from,
            sealed=isinstance(items, list) and any(isinstance(i, dict) and i.get("encrypted_content") for i in items),
        )

    @staticmethod
    def _message(group: Group, sealed_scale: float) -> Message:
        if group.kind == "instructions":
            value = group.items[0]
            return {"role": "system", "content": value if group.editable == 0 else opaque(orjson.dumps(value).decode())}
        if group.kind == "text":
            return {"role": "user", "content": group.items[0]}
        return _message(group, sealed_scale)

    def render(
        self, body: Mapping[str, Any], conversation: Conversation, out: Sequence[Message], sources: Sequence[int]
    ) -> dict[str, Any]:
        rendered = {k: v for k, v in body.items() if k != "instructions"}
        items: list[Any] = []
        for message, source in zip(out, sources, strict=True):
            if source < 0:  # a capsule or an omission note the engine inserted
                items.append({"type": "message", "role": message["role"], "content": content_text(message) or ""})
                continue
            group: Group = conversation.groups[source]
            edited = message is not conversation.messages[source]
            text = content_text(message) if edited else None
            if group.kind == "instructions":
                rendered["instructions"] = text if text is not None else group.items[0]
            elif group.kind == "text":
                items.append({"role": "user", "content": text if text is not None else group.items[0]})
            else:
                keep = keeps_media(message)
                items += _edited(group, text, keep) if text is not None and group.editable >= 0 else group.items
        rendered["input"] = items
        return rendered

    def session_hints(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> Sequence[Any]:
        """Codex's `session-id` header (`session_id` before 0.17x), then `prompt_cache_key`, then
        `metadata.session_id`."""
        header = next((found for name in CODEX_SESSION_HEADERS if (found := _header(headers, name))), None)
        metadata = body.get("metadata")
        return header, body.get("prompt_cache_key"), metadata.get("session_id") if isinstance(metadata, dict) else None

    def with_cache_breakpoints(self, body: dict[str, Any], place: bool) -> dict[str, Any]:
        return body  # OpenAI caches every prefix by itself

    def with_session(self, body: dict[str, Any], session_id: str) -> dict[str, Any]:
        """OpenAI routes cache hits by `prompt_cache_key`: a client that sends none gets its session's id."""
        return body if body.get("prompt_cache_key") else {**body, "prompt_cache_key": session_id}

    def with_usage_requested(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        return body, False  # every response reports usage (response.completed)

    def usage(self, payloads: Sequence[Mapping[str, Any]]) -> Usage | None:
        for payload in reversed(payloads):
            usage = payload.get("usage")
            response = payload.get("response")
            if not isinstance(usage, dict) and isinstance(response, dict):
                usage = response.get("usage")
            if found := cached_usage(usage, "input_tokens", "input_tokens_details"):
                return found
        return None

    def stream_undecided(self, head: bytes) -> bool:
        return stream_undecided(head)

    def overflow_tokens(self, status: int, body: bytes) -> int | None:
        return overflow_tokens(status, body)

    def error_body(self, message: str, status: int, code: str | None, param: str | None) -> bytes:
        return error_body(message, status, code, param)


RESPONSES = ResponsesDialect()
