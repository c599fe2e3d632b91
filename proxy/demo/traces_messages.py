"""The packaged agent traces as an Anthropic Messages client (Claude Code and its kin) would have sent them.

The same turns as chat (`proxy.demo.traces.requests`): the first system message becomes `system`,
tool calls become `tool_use` blocks and their results `tool_result` blocks in the next user
message (consecutive user-side messages are one message), and every assistant turn opens with
a thinking block signed as the simulator signs what it issues (`proxy.demo.simulator.blocks.sign`),
so the simulator refuses one that comes back altered. `breakpoints="claude-code"` marks the
system prompt and the last message with `cache_control`, as Claude Code does; `"none"` marks nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from proxy.demo.simulator.blocks import sign
from proxy.demo.traces import Trace, message_text, requests

Block = dict[str, Any]
EPHEMERAL = {"type": "ephemeral"}
BREAKPOINT_STYLES = ("claude-code", "none")


def messages_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Chat's `{"type": "function", "function": {...}}` tools in the Messages shape."""
    if not tools:
        return None
    out = []
    for tool in tools:
        function = tool.get("function") or {}
        schema = function.get("parameters") or {"type": "object", "properties": {}}
        out.append(
            {"name": function.get("name", ""), "description": function.get("description", ""), "input_schema": schema}
        )
    return out


def _arguments(raw: Any) -> Any:
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return {"raw": raw}
    return value if isinstance(value, dict) else {"value": value}


def _assistant(k: int, message: dict[str, Any]) -> list[Block]:
    """One assistant turn: a signed thinking block, then its text and its tool calls."""
    text = message_text(message.get("content"))
    thought = f"Step {k}: deciding what to do next. " + text[:400]
    blocks: list[Block] = [{"type": "thinking", "thinking": thought, "signature": sign(thought)}]
    if text:
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        blocks.append(
            {"type": "tool_use", "id": call.get("id"), "name": function.get("name", ""),
             "input": _arguments(function.get("arguments", "{}"))}
        )  # fmt: skip
    return blocks


def _user_blocks(message: dict[str, Any]) -> list[Block]:
    if message.get("role") == "tool":
        result = message_text(message["content"])
        return [{"type": "tool_result", "tool_use_id": message.get("tool_call_id"), "content": result}]
    return [{"type": "text", "text": message_text(message.get("content")) or "(empty)"}]


def _append(out: list[dict[str, Any]], k: int, message: dict[str, Any]) -> None:
    """Add one chat message: an assistant turn is a message; tool results and user text join the user message."""
    if message.get("role") == "assistant":
        out.append({"role": "assistant", "content": _assistant(k, message)})
        return
    blocks = _user_blocks(message)
    if out and out[-1]["role"] == "user":
        out[-1] = {"role": "user", "content": [*out[-1]["content"], *blocks]}
    else:
        out.append({"role": "user", "content": blocks})


def _marked(message: dict[str, Any]) -> dict[str, Any]:
    """A copy of the message whose last block carries a breakpoint."""
    content = list(message["content"])
    content[-1] = {**content[-1], "cache_control": EPHEMERAL}
    return {**message, "content": content}


def messages_requests(trace: Trace, model: str, breakpoints: str = "claude-code") -> Iterator[dict[str, Any]]:
    """Each request body the agent would have sent, turn by turn (a fresh body; blocks shared between turns)."""
    if breakpoints not in BREAKPOINT_STYLES:
        raise ValueError(f"breakpoints is one of {', '.join(BREAKPOINT_STYLES)}, not {breakpoints!r}")
    messages = trace.messages
    system = messages[0] if messages and messages[0].get("role") == "system" else None
    converted: list[dict[str, Any]] = []
    done, tools = (1 if system else 0), messages_tools(trace.tools)
    for k, (request, _answer) in enumerate(requests(trace)):
        for message in request[done:]:
            _append(converted, k, message)
        done = len(request)
        body: dict[str, Any] = {"model": model, "max_tokens": 4096, "messages": list(converted)}
        body["thinking"] = {"type": "enabled", "budget_tokens": 2048}
        if system is not None:
            body["system"] = [{"type": "text", "text": message_text(system.get("content"))}]
        if tools:
            body["tools"] = tools
        if breakpoints == "claude-code":
            body["messages"][-1] = _marked(body["messages"][-1])
            if system is not None:
                body["system"] = [{**body["system"][0], "cache_control": EPHEMERAL}]
        yield body
