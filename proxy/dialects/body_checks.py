"""Request-body checks for chat completions: a malformed body gets a clear local 400.

Only the shape the proxy relies on is checked (the engine walks `messages`); every
other field is the upstream's business.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from proxy.errors import InvalidRequest

__all__ = ["InvalidRequest", "check_messages", "parse_chat_body"]

ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _check_message(index: int, message: Any) -> None:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise InvalidRequest(f"Invalid '{where}': expected an object, got {_kind(message)}.", where, "invalid_type")
    role = message.get("role")
    if role is None:
        raise InvalidRequest(
            f"Missing required parameter: '{where}.role'.", f"{where}.role", "missing_required_parameter"
        )
    if role not in ROLES:
        shown = repr(role) if isinstance(role, str) else _kind(role)
        raise InvalidRequest(
            f"Invalid value for '{where}.role': {shown[:40]}. Supported values are: {', '.join(ROLES)}.",
            f"{where}.role",
            "invalid_value",
        )
    content = message.get("content")
    if isinstance(content, list):
        for part_index, part in enumerate(content):
            if not isinstance(part, dict):
                param = f"{where}.content[{part_index}]"
                raise InvalidRequest(
                    f"Invalid '{param}': expected an object, got {_kind(part)}.", param, "invalid_type"
                )
    elif content is not None and not isinstance(content, str):
        raise InvalidRequest(
            f"Invalid type for '{where}.content': expected a string, null or an array of objects, "
            f"got {_kind(content)}.",
            f"{where}.content",
            "invalid_type",
        )
    tool_calls = message.get("tool_calls")
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise InvalidRequest(
            f"Invalid type for '{where}.tool_calls': expected an array, got {_kind(tool_calls)}.",
            f"{where}.tool_calls",
            "invalid_type",
        )


_INT64 = range(-(2**63), 2**64)  # what orjson reads and writes as an integer
_WIDE = 2.0**63  # a float at least this large may have been an integer orjson could not hold


def has_wide_number(value: Any) -> bool:
    """Whether a parsed JSON value holds a float of 2**63 or more (either sign): maybe an integer past 64 bits,
    which orjson reads as a float (2**64 would go upstream as 1.8446744073709552e+19). A walk of the parsed
    nodes, not the bytes: an agent's body is few nodes and many long strings."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif type(node) is float and abs(node) >= _WIDE:
            return True
    return False


# Each ASCII digit as "0", every other byte as a space: a run of digits becomes a run of zeros, found by `find`.
_AS_ZEROS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN = b"0" * len(str(2**63))  # 19: an integer orjson cannot hold has at least these many digits


_BEFORE_NUMBER = frozenset(b":[,")  # what a JSON value follows (whitespace and a minus sign aside)
_SPACE = frozenset(b" \t\r\n")


def may_hold_wide_integer(raw: bytes) -> bool:
    """Whether JSON text `raw` has a run of 19 or more digits where a number may start, without which it holds no
    integer past 64 bits.

    A necessary condition for `has_wide_number` to matter, read off the bytes at about a nanosecond each
    (the walk costs more per node than this per byte); a float written with an exponent (1e19) is read the
    same by orjson and by the stdlib, so only such a run needs the exact parse. A run counts where it starts the
    text or follows `:`, `[` or `,` (a minus sign and whitespace between): a number token always does, so a run
    inside a string that follows anything else (a hash, an id in a log line) no longer sends every turn of its
    session through the walk.
    """
    zeros = raw.translate(_AS_ZEROS)
    at = zeros.find(_LONG_RUN)
    while at >= 0:
        start = zeros.rfind(b" ", 0, at) + 1  # where this run of digits begins
        j = start - 1
        if j >= 0 and raw[j] == 0x2D:  # -
            j -= 1
        while j >= 0 and raw[j] in _SPACE:
            j -= 1
        if j < 0 or raw[j] in _BEFORE_NUMBER:
            return True
        end = zeros.find(b" ", at)
        if end < 0:
            return False
        at = zeros.find(_LONG_RUN, end)
    return False


def _exact_int(digits: str) -> int | orjson.Fragment:
    value = int(digits)
    return value if value in _INT64 else orjson.Fragment(digits)  # re-serialised as these very digits


def json_body(raw: bytes) -> Any:
    """The request body's JSON value, or InvalidRequest saying where it does not parse (every API's first check).

    An integer past 64 bits is kept as its own digits (an `orjson.Fragment`), so a re-serialised body sends it
    exactly as the client did; orjson still judges what parses, so both parsers agree on every accepted body.
    """
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}", None, "invalid_json") from exc
    if may_hold_wide_integer(raw) and has_wide_number(value):
        return json.loads(raw, parse_int=_exact_int)
    return value


def parse_chat_body(raw: bytes) -> dict[str, Any]:
    """The parsed chat-completions body, or InvalidRequest naming what is wrong and where."""
    body = json_body(raw)
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object, got {_kind(body)}.", None, "invalid_type")
    if "messages" not in body:
        raise InvalidRequest("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise InvalidRequest(
            f"Invalid type for 'messages': expected an array, got {_kind(messages)}.", "messages", "invalid_type"
        )
    check_messages(messages)
    return body


def check_messages(messages: list, offset: int = 0) -> None:
    """Raise InvalidRequest for the first malformed message; `offset` is the index of `messages[0]`."""
    for index, message in enumerate(messages, offset):
        _check_message(index, message)
