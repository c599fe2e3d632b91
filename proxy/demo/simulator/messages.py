"""The simulator's Anthropic Messages API: `POST /v1/messages`, JSON or the real event stream.

Refusals carry the real API's wording (Claude Code matches on it): a role other than user, assistant
and system (mid-conversation, as the newer models take it), a `tool_use` without its `tool_result`, a
`tool_result` without its `tool_use`, a thinking block whose signature the simulator did not issue,
more than 4 cache breakpoints, a 1-hour breakpoint after a 5-minute one, and `prompt is too long` (at
1M tokens with the `context-1m-` beta). Usage bills cache writes and reads by the request's
breakpoints (`blocks`), the writes split by TTL in `cache_creation` (JSON and `message_start`;
`message_delta` carries only the totals).
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from aiohttp import web

from proxy.demo.simulator.answers import tool_calls
from proxy.demo.simulator.blocks import (
    MAX_BREAKPOINTS,
    THINKING_RULE,
    blocks_of,
    breakpoints,
    lookup_positions,
    measure,
    sign,
    ttl_order_problem,
    verify,
    written,
)
from proxy.demo.simulator.faults import BODY, number_header, send, send_json
from proxy.demo.simulator.model import SIMULATOR, Simulator
from proxy.errors import anthropic_error_body
from proxy.tokens.counter import counter_for

# `system` mid-conversation: what Claude Code sends with its newer models (the `mid-conversation-system` beta).
ROLES = ("user", "assistant", "system")
ONE_MILLION = 1_000_000
THOUGHT = "The user wants the failing test fixed. I read the last tool output and decide what to run next."


def anthropic_error(status: int, message: str, error_type: str = "invalid_request_error") -> web.Response:
    """An error exactly as the real API shapes it."""
    return web.Response(status=status, body=anthropic_error_body(message, error_type), content_type="application/json")


def _pairing_problem(messages: list[Any], i: int) -> str | None:
    """Anthropic's words for a `tool_use` not answered in the next message, or a `tool_result` nothing asked for."""
    message = messages[i]
    content = [b if isinstance(b, dict) else {} for b in blocks_of(message.get("content"))]
    asked = [b.get("id") for b in content if b.get("type") == "tool_use"]
    if message.get("role") == "user":
        before = messages[i - 1] if i else {}
        previous = {b.get("id") for b in blocks_of(before.get("content")) if isinstance(b, dict)}
        for j, block in enumerate(content):
            if block.get("type") == "tool_result" and block.get("tool_use_id") not in previous:
                return (
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding `tool_use` "
                    "block in the previous message."
                )
        return None
    if not asked or i == len(messages) - 1:
        return None
    after = messages[i + 1]
    answered = {b.get("tool_use_id") for b in blocks_of(after.get("content")) if isinstance(b, dict)}
    missing = [str(a) for a in asked if a not in answered or after.get("role") != "user"]
    if missing:
        return (
            f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
            f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block in the next "
            "message."
        )
    return None


def _thinking_problem(body: dict[str, Any]) -> str | None:
    """A thinking block the simulator did not sign, or (thinking on) a final tool loop not opened by thinking."""
    messages = body["messages"]
    for i, message in enumerate(messages):
        for j, block in enumerate(blocks_of(message.get("content"))):
            is_thinking = isinstance(block, dict) and block.get("type") == "thinking"
            if is_thinking and not verify(block.get("thinking"), block.get("signature")):
                return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive"):
        return None
    last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), None)
    if last is None or last != len(messages) - 2:
        return None
    content = blocks_of(messages[last].get("content"))
    uses_tools = any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)
    first = content[0].get("type") if content and isinstance(content[0], dict) else None
    if uses_tools and first not in ("thinking", "redacted_thinking"):
        return (
            f"messages.{last}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first}`. "
            + THINKING_RULE
        )
    return None


def request_problem(body: Any) -> str | None:
    """The 400 the real API gives a Messages body it cannot take (its message), or None."""
    if not isinstance(body, dict):
        return "There was an issue with the formatting or content of your request. Please check the request body."
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            return f"{name}: Field required"
    value = body["max_tokens"]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return "max_tokens: Input should be greater than or equal to 1"
    messages = body["messages"]
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return "messages: Input should be a valid list"
    for i, message in enumerate(messages):
        if message.get("role") not in ROLES:
            return f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'"
        if problem := _pairing_problem(messages, i):
            return problem
    return _thinking_problem(body)


def _content(sim: Simulator, body: dict[str, Any], request: web.Request) -> list[dict[str, Any]]:
    """What the model answers: a signed thinking block when asked to think, then tool calls or text."""
    content: list[dict[str, Any]] = []
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
        content.append({"type": "thinking", "thinking": THOUGHT, "signature": sign(THOUGHT)})
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict) and "input_schema" in t]
    n_calls = int(number_header(request, "X-Sim-Tool-Calls", sim.config.tool_calls)) if tools else 0
    offered = [{"function": {"name": t.get("name"), "parameters": t.get("input_schema")}} for t in tools]
    for call in tool_calls(offered, n_calls, sim.next_id()) if n_calls > 0 else []:
        name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
        content.append({"type": "tool_use", "id": f"toolu_{call['id']}", "name": name, "input": arguments})
    if len(content) == (1 if content and content[0]["type"] == "thinking" else 0):
        content.append({"type": "text", "text": sim.config.answer})
    return content


def bill(sim: Simulator, request: web.Request, body: dict[str, Any], prompt: int, chain: list) -> dict[str, Any]:
    """`usage` by the request's breakpoints: reads of what an earlier request wrote, writes up to the last one."""
    key = request.headers.get("x-api-key") or request.headers.get("Authorization") or ""
    lookups = [(p.digest, p.tokens) for p in lookup_positions(chain)]
    read = sim.cached_tokens(key, lookups, granularity=1)
    five, hour = written(chain, read, sim.config.cache_min_tokens)
    sim.remember(key, [(chain[i].digest, chain[i].tokens) for i in breakpoints(chain)])
    return {
        "input_tokens": prompt - read - five - hour, "cache_creation_input_tokens": five + hour,
        "cache_read_input_tokens": read,
        "cache_creation": {"ephemeral_5m_input_tokens": five, "ephemeral_1h_input_tokens": hour},
        "output_tokens": 0, "service_tier": "standard",
    }  # fmt: skip


async def create_message(request: web.Request) -> web.StreamResponse:
    sim, body = request.app[SIMULATOR], request[BODY]
    sim.totals.requests += 1
    if problem := request_problem(body):
        return anthropic_error(400, problem)
    try:
        prompt, chain = measure(body, sim.config.claude_token_ratio)
    except TypeError:  # orjson refuses JSON nested over 254 deep
        return anthropic_error(400, "messages: nested too deeply")
    if (marks := len(breakpoints(chain))) > MAX_BREAKPOINTS:
        return anthropic_error(
            400, f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {marks}."
        )
    if problem := ttl_order_problem(chain):
        return anthropic_error(400, problem)
    window = sim.config.window(body["model"])
    if "context-1m-" in request.headers.get("anthropic-beta", ""):
        window = max(window, ONE_MILLION)  # the 1M-context beta
    if prompt > window:
        sim.totals.refused += 1
        return anthropic_error(400, f"prompt is too long: {prompt} tokens > {window} maximum")
    usage = bill(sim, request, body, prompt, chain)
    content = _content(sim, body, request)
    counter = counter_for("o200k_base")
    usage["output_tokens"] = sum(counter.count_text(orjson.dumps(b).decode()) for b in content)
    sim.totals.answered += 1
    sim.totals.prompt_tokens += prompt
    sim.totals.cached_tokens += usage["cache_read_input_tokens"]
    sim.totals.written_tokens += usage["cache_creation_input_tokens"]
    sim.totals.completion_tokens += usage["output_tokens"]
    stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    message = {
        "id": f"msg_sim{sim.next_id():08d}", "type": "message", "role": "assistant", "model": body["model"],
        "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage,
    }  # fmt: skip
    if body.get("stream") is True:
        chunks = max(1, int(number_header(request, "X-Sim-Chunks", sim.config.chunks)))
        return await _stream(request, message_events(message, chunks))
    return await send_json(request, message)


def _pieces(text: str, n: int) -> list[str]:
    n = max(1, min(n, len(text)))
    return [text[len(text) * k // n : len(text) * (k + 1) // n] for k in range(n)]


def _block_events(index: int, block: dict[str, Any], chunks: int) -> list[dict[str, Any]]:
    """content_block_start (the block empty), its deltas, content_block_stop."""
    kind, at = block["type"], {"index": index}
    opened: dict[str, Any]
    if kind == "thinking":
        opened = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(block["thinking"], chunks)]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "tool_use":
        opened = {**block, "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in _pieces(json.dumps(block["input"]), chunks)]
    else:
        opened = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in _pieces(block["text"], chunks)]
    events = [{"type": "content_block_start", **at, "content_block": opened}]
    events += [{"type": "content_block_delta", **at, "delta": delta} for delta in deltas]
    return [*events, {"type": "content_block_stop", **at}]


def message_events(message: dict[str, Any], chunks: int) -> list[dict[str, Any]]:
    """message_start (usage so far), ping, each block, message_delta (stop reason, final usage), message_stop."""
    usage = message["usage"]
    started = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": started}, {"type": "ping"}]
    for index, block in enumerate(message["content"]):
        events += _block_events(index, block, chunks)
    final = {key: usage[key] for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")}
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    final["output_tokens"] = usage["output_tokens"]
    events.append({"type": "message_delta", "delta": delta, "usage": final})
    return [*events, {"type": "message_stop"}]


async def _stream(request: web.Request, events: list[dict[str, Any]]) -> web.StreamResponse:
    """Each event as `event: <type>` + `data: <json>`, as the real API sends them."""
    sim = request.app[SIMULATOR]
    pieces = [b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events]
    delay = number_header(request, "X-Sim-Delay-Ms", sim.config.chunk_delay_s * 1000) / 1000
    return await send(request, pieces, "text/event-stream", sim.config.fault_after_chunks, delay)


async def count_tokens(request: web.Request) -> web.StreamResponse:
    """POST /v1/messages/count_tokens: the prompt as `create` would bill it."""
    sim, body = request.app[SIMULATOR], request[BODY]
    if isinstance(body, dict) and "max_tokens" not in body:
        body = {**body, "max_tokens": 1}
    if problem := request_problem(body):
        return anthropic_error(400, problem)
    prompt, _ = measure(body, sim.config.claude_token_ratio)
    return await send_json(request, {"input_tokens": prompt})


def add_routes(app: web.Application) -> None:
    """The Messages routes, on a simulator app."""
    app.router.add_post("/v1/messages", create_message)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
