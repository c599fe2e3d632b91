"""The packaged agent traces as a Responses API client (Codex CLI, the Agents SDK) would have sent them.

The same turns as chat (`proxy.demo.traces.requests`): the first system message becomes
`instructions`, tool calls become `function_call` items and their results `function_call_output`,
and each assistant turn's output is preceded by a `reasoning` item whose `encrypted_content`
is signed as the simulator signs what it issues (`proxy.demo.simulator.items.seal`), so the
simulator refuses any reasoning item that comes back altered.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from proxy.demo.simulator.items import seal
from proxy.demo.traces import Trace, message_text, requests

Item = dict[str, Any]
INCLUDE = ["reasoning.encrypted_content"]


def responses_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Chat's `{"type": "function", "function": {...}}` tools in the Responses shape (flat)."""
    if not tools:
        return None
    return [{"type": "function", **tool["function"]} for tool in tools if isinstance(tool.get("function"), dict)]


def _assistant(k: int, message: dict[str, Any]) -> list[Item]:
    """One assistant turn: its reasoning, then its text and its calls, with ids that say they followed reasoning."""
    text = message_text(message.get("content"))
    reasoning_id = f"rs_trace{k:04d}"
    thought = f"Step {k}: deciding what to do next. " + text[:400]
    items: list[Item] = [
        {"type": "reasoning", "id": reasoning_id, "summary": [], "encrypted_content": seal(reasoning_id, thought)}
    ]
    if text:
        part = {"type": "output_text", "text": text, "annotations": []}
        items.append({"type": "message", "id": f"msg_rtrace{k:04d}", "role": "assistant", "content": [part]})
    for j, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        items.append(
            {"type": "function_call", "id": f"fc_rtrace{k:04d}_{j}", "call_id": call.get("id"),
             "name": function.get("name", ""), "arguments": function.get("arguments", "")}
        )  # fmt: skip
    return items


def _items(k: int, message: dict[str, Any]) -> list[Item]:
    role = message.get("role")
    if role == "assistant":
        return _assistant(k, message)
    if role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": message.get("tool_call_id"),
                "output": message_text(message.get("content")),
            }
        ]
    part_type = "input_text"
    part = {"type": part_type, "text": message_text(message.get("content"))}
    return [{"type": "message", "role": role, "content": [part]}]


def responses_requests(trace: Trace, model: str) -> Iterator[dict[str, Any]]:
    """Each request body the agent would have sent, turn by turn (a fresh body; items shared between turns)."""
    messages = trace.messages
    instructions = messages[0] if messages and messages[0].get("role") == "system" else None
    converted: list[Item] = []
    done = 1 if instructions else 0
    tools = responses_tools(trace.tools)
    for k, (request, _answer) in enumerate(requests(trace)):
        for message in request[done:]:
            converted += _items(k, message)
        done = len(request)
        body: dict[str, Any] = {"model": model, "input": list(converted), "store": False, "include": INCLUDE}
        body["reasoning"] = {"effort": "medium"}
        if instructions is not None:
            body["instructions"] = message_text(instructions.get("content"))
        if tools:
            body["tools"] = tools
        yield body
