"""What the real API says, in its exact shapes: errors and refusals, usage, tool calls, streamed chunks."""

from __future__ import annotations

import itertools
import json
from typing import Any

from aiohttp import web

from proxy.errors import error_response

FINGERPRINT = "fp_sim0c0ffee"


def openai_error(
    status: int, message: str, type_: str, code: str | None = None, param: str | None = None, headers: Any = None
) -> web.Response:
    """An error exactly as the real API words and shapes it (key order included)."""
    return error_response(status, message, code, param, headers, type_=type_)


def pairing_error(messages: list[dict]) -> tuple[str, str] | None:
    """OpenAI's refusal (message, param) for tool results out of place or tool calls left unanswered."""
    calls_at, open_calls = -1, set()
    pending: list[str] = []
    for i, message in enumerate(messages):
        if message.get("role") == "tool":
            if calls_at < 0:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
                    "with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            call_id = message.get("tool_call_id")
            if call_id not in open_calls:
                return (
                    f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in 'tool_calls' of previous message.",
                    f"messages.[{i}].tool_call_id",
                )
            if call_id in pending:
                pending.remove(call_id)
            continue
        if pending:
            break
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        calls_at = i if calls else -1
        ids = [c.get("id") for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
        if not all(isinstance(call_id, str) for call_id in ids):
            return (f"Invalid type for 'messages.[{i}].tool_calls[].id': expected a string.", f"messages.[{i}]")
        open_calls, pending = set(ids), [call_id for call_id in ids if isinstance(call_id, str)]
    if pending:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            "'tool_call_id'. The following tool_call_ids did not have response messages: "
            + ", ".join(map(str, pending)),
            f"messages.[{calls_at}].role",
        )
    return None


def request_error(body: Any) -> web.Response | None:
    """The 400 the real API gives a chat body it cannot take, or None."""
    if not isinstance(body, dict):
        return openai_error(400, "We could not parse the JSON body of your request.", "invalid_request_error")
    if not isinstance(body.get("model"), str):
        return openai_error(400, "you must provide a model parameter", "invalid_request_error")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return openai_error(400, "[] is too short - 'messages'", "invalid_request_error", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            return openai_error(400, f"Invalid value for 'messages.[{i}].role'.", "invalid_request_error")
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            return openai_error(400, f"Invalid value for '{name}': expected an integer >= 1.", "invalid_request_error")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        message = f"Invalid type for 'stream_options': expected an object, but got {type(options).__name__} instead."
        return openai_error(400, message, "invalid_request_error", param="stream_options")
    problem = pairing_error(messages)
    return openai_error(400, problem[0], "invalid_request_error", param=problem[1]) if problem else None


def window_error(window: int, prompt: int, completion: int) -> web.Response:
    """OpenAI's words: with max_tokens it names the request's total and its two parts."""
    message = f"This model's maximum context length is {window} tokens. However, "
    if completion:
        message += (
            f"you requested {prompt + completion} tokens ({prompt} in the messages, {completion} in the "
            "completion). Please reduce the length of the messages or completion."
        )
    else:
        message += f"your messages resulted in {prompt} tokens. Please reduce the length of the messages."
    return openai_error(400, message, "invalid_request_error", "context_length_exceeded", "messages")


def billed_usage(prompt: int, cached: int, completion: int) -> dict[str, Any]:
    """`usage` with every detail field the real API sends."""
    return {
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
    }  # fmt: skip


def _sample(schema: Any) -> Any:
    kind = str(schema.get("type")) if isinstance(schema, dict) else ""
    return {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}.get(kind, "ls -la")


def structured_answer(response_format: Any) -> str | None:
    """The content for a `response_format` (`json_schema`: an instance valid against it; `json_object`: an
    object), or None for plain text."""
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "json_object":
        return json.dumps({"answer": "ok"})
    if kind != "json_schema":
        return None
    schema = (response_format.get("json_schema") or {}).get("schema") or {}
    return json.dumps(_instance(schema, schema, 0))


def _instance(schema: Any, root: dict, depth: int) -> Any:
    """A small value valid against `schema` (types, properties, required, enum/const, $ref, anyOf, min sizes)."""
    if not isinstance(schema, dict) or depth > 32:
        return None
    if "$ref" in schema:  # "#/$defs/Name", as the SDK's pydantic schemas write them
        target: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return _instance(target, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return _instance(schema[key][0], root, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: _instance(props[name], root, depth + 1) for name in props}
    if kind == "array":
        return [_instance(schema.get("items"), root, depth + 1) for _ in range(schema.get("minItems", 1))]
    if kind == "string":
        return "x" * max(2, schema.get("minLength", 0))
    if kind in ("integer", "number"):
        value = max(schema.get("minimum", 1), schema.get("exclusiveMinimum", 0) + 1)
        return int(value) if kind == "integer" else float(value)
    return {"boolean": True, "null": None}.get(kind)


def tool_calls(tools: list[Any], n: int, base: int) -> list[dict[str, Any]]:
    """`n` calls of the offered tools, round robin, with arguments that fit their schemas."""
    calls = []
    for i in range(n):
        function = (tools[i % len(tools)] or {}).get("function") or {}
        props = (function.get("parameters") or {}).get("properties") or {}
        arguments = json.dumps({name: _sample(schema) for name, schema in props.items()})
        name = function.get("name", "f")
        calls.append(
            {"id": f"call_sim{base}_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    return calls


def _split(text: str, n: int) -> list[str]:
    n = max(1, min(n, len(text)))
    bounds = [len(text) * k // n for k in range(n + 1)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def chunk_choices(content: str | None, calls: list[dict], chunks: int) -> list[list[dict]]:
    """The `choices` of each chunk of one streamed answer, as the real API sends them."""

    def event(delta: dict, finish: str | None = None) -> list[dict]:
        return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

    if not calls:
        events = [event({"role": "assistant", "content": "", "refusal": None})]
        events += [event({"content": piece}) for piece in _split(content or "", chunks)]
        return [*events, event({}, "stop")]
    events = [event({"role": "assistant", "content": None})]
    for i, call in enumerate(calls):
        opening = {"index": i, "id": call["id"], "type": "function", "function": {**call["function"], "arguments": ""}}
        events.append(event({"tool_calls": [opening]}))
        for piece in _split(call["function"]["arguments"], max(1, chunks // len(calls))):
            events.append(event({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
    return [*events, event({}, "tool_calls")]
