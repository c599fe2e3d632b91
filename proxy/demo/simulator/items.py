"""The Responses API's items as the simulator checks, bills and issues them.

Reasoning items carry `encrypted_content` the simulator signs (`seal`), so an edited or
forged one is refused as the real API refuses it; items it issued after a reasoning item
have ids that say so (`fc_r…`, `msg_r…`), so one sent back without its reasoning is refused too.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from typing import Any

import orjson

_KEY = b"context-proxy simulator: reasoning seal"  # a test upstream's key: what matters is that only it signs
AFTER_REASONING = ("fc_r", "msg_r")  # id prefixes of items issued right after a reasoning item
TEXT_PARTS = ("input_text", "output_text", "text")


def seal(item_id: str, text: str) -> str:
    """The `encrypted_content` of a reasoning item: its text, signed with the item's id."""
    payload = base64.urlsafe_b64encode(text.encode()).decode()
    mac = hmac.new(_KEY, f"{item_id}.{payload}".encode(), hashlib.sha256).hexdigest()[:32]
    return f"gAAAA{payload}.{mac}"


def unseal(item_id: str, sealed: Any) -> str | None:
    """The reasoning text, or None when `sealed` is not exactly what `seal` issued for this id."""
    if not isinstance(sealed, str) or not sealed.startswith("gAAAA") or "." not in sealed:
        return None
    payload, mac = sealed[5:].rsplit(".", 1)
    expected = hmac.new(_KEY, f"{item_id}.{payload}".encode(), hashlib.sha256).hexdigest()[:32]
    if not hmac.compare_digest(mac, expected):
        return None
    try:
        return base64.urlsafe_b64decode(payload.encode()).decode()
    except ValueError:
        return None


def item_type(item: dict[str, Any]) -> str:
    kind = item.get("type")
    return kind if isinstance(kind, str) else "message" if "role" in item else ""


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return orjson.dumps(value).decode()


def as_message(item: dict[str, Any]) -> dict[str, Any]:
    """An item as a chat message, for the prefix-cache model's count (a reasoning item: the text it seals)."""
    kind = item_type(item)
    if kind == "message":
        return {"role": str(item.get("role")), "content": _text(item.get("content"))}
    if kind.endswith("_call_output"):
        return {"role": "tool", "tool_call_id": str(item.get("call_id")), "content": _text(item.get("output"))}
    if kind.endswith("_call") and "call_id" in item:
        arguments = item.get("arguments", item.get("input", ""))
        function = {"name": str(item.get("name", kind)), "arguments": _text(arguments)}
        return {"role": "assistant", "content": None, "tool_calls": [{"id": item["call_id"], "function": function}]}
    if kind == "reasoning":  # billed by the reasoning it seals, as the API bills it, not by the blob's characters
        summary = _text(item.get("summary") or [])
        sealed = unseal(str(item.get("id")), item.get("encrypted_content")) or ""
        return {"role": "assistant", "content": "\n".join(filter(None, (summary, sealed)))}
    return {"role": "user", "content": orjson.dumps(item).decode()}


def input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request as chat messages: `instructions` first, then each input item."""
    items = body.get("input")
    messages = [{"role": "user", "content": items}] if isinstance(items, str) else [as_message(i) for i in items or []]
    instructions = body.get("instructions")
    return ([{"role": "system", "content": _text(instructions)}] if instructions else []) + messages


def _problem(i: int, items: Sequence[dict[str, Any]], store: bool, outputs: set[str], calls: set[str]) -> str | None:
    item, kind = items[i], item_type(items[i])
    item_id = str(item.get("id", ""))
    if kind.endswith("_call_output") and item.get("call_id") not in calls:
        return f"No tool call found for function call output with call_id {item.get('call_id')}."
    if kind.endswith("_call") and "call_id" in item and item["call_id"] not in outputs and i < len(items) - 1:
        return f"No tool output found for function call {item['call_id']}."
    if kind == "reasoning":
        if "encrypted_content" not in item and not store:
            return (
                f"Item with id '{item_id}' not found. Items are not persisted when `store` is set to false. "
                "Try again with `store` set to true, or remove this item from your input."
            )
        if "encrypted_content" in item and unseal(item_id, item["encrypted_content"]) is None:
            return f"The encrypted content for item {item_id} could not be verified."
        if i + 1 == len(items) or item_type(items[i + 1]) in ("reasoning", "") or items[i + 1].get("role") == "user":
            return f"Item '{item_id}' of type 'reasoning' was provided without its required following item."
    if item_id.startswith(AFTER_REASONING):
        before = i - 1
        while before >= 0 and str(items[before].get("id", "")).startswith(AFTER_REASONING):
            before -= 1
        if before < 0 or item_type(items[before]) != "reasoning":
            return f"Item '{item_id}' of type '{kind}' was provided without its required 'reasoning' item."
    return None


def input_problem(body: dict[str, Any]) -> str | None:
    """The real API's refusal of an input list: unpaired calls and outputs, reasoning not as it was issued."""
    items = body.get("input")
    if not isinstance(items, list):
        return None
    if not all(isinstance(item, dict) for item in items):
        return "Invalid 'input': every item must be an object."
    outputs = {item.get("call_id") for item in items if item_type(item).endswith("_call_output")}
    seen_calls: set[str] = set()
    for i, item in enumerate(items):
        if problem := _problem(i, items, body.get("store") is not False, outputs, seen_calls):
            return problem
        if item_type(item).endswith("_call"):
            seen_calls.add(item.get("call_id"))
    return None
