"""The simulator's Responses API: `POST /v1/responses` (JSON or the real event stream) and stored responses.

Billing and refusals follow the chat route: the same prefix-cache model over the request's items
(`items.input_messages`), the window refused with the real API's words — a 400, or for a stream a
200 whose `response.created` is followed by an `error` and a `response.failed` event.
"""

from __future__ import annotations

import time
from typing import Any, cast

import orjson
from aiohttp import web

from proxy.demo.simulator.answers import openai_error, tool_calls
from proxy.demo.simulator.faults import BODY, number_header, send, send_json
from proxy.demo.simulator.items import input_messages, input_problem, seal
from proxy.demo.simulator.model import SIMULATOR, Simulator
from proxy.tokens.counter import counter_for, encoding_for_model

STORED = web.AppKey("sim_stored_responses", dict)  # response id -> (its input items, the response)
WINDOW_MESSAGE = "Your input exceeds the context window of this model. Please adjust your input and try again."
REASONING = (
    "The user wants the failing test fixed. I read the tool output, decide which file to open next and "
    "check the result before I answer."
)


def _error(message: str, code: str | None = None, param: str | None = "input") -> web.Response:
    return openai_error(400, message, "invalid_request_error", code, param)


def _request_error(body: Any) -> web.Response | None:
    if not isinstance(body, dict):
        return openai_error(400, "We could not parse the JSON body of your request.", "invalid_request_error")
    if not isinstance(body.get("model"), str):
        return _error("Missing required parameter: 'model'.", "missing_required_parameter", "model")
    items = body.get("input")
    if not isinstance(items, str | list) and not body.get("previous_response_id"):
        return _error("Missing required parameter: 'input'.", "missing_required_parameter")
    value = body.get("max_output_tokens")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 16):
        return _error("Invalid 'max_output_tokens': integer below minimum value.", "integer_below_min_value")
    problem = input_problem(body)
    return _error(problem) if problem else None


def _with_history(request: web.Request, body: dict[str, Any]) -> list[Any] | web.Response:
    """The whole input: a stored response's input and output, then this request's items."""
    items = body.get("input")
    if isinstance(items, str):  # kept as the API keeps it: one user message of input_text
        items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": items}]}]
    items = list(items or [])
    previous = body.get("previous_response_id")
    if not previous:
        return items
    stored = request.app[STORED].get(previous)
    if stored is None:
        return openai_error(404, f"Previous response with id '{previous}' not found.", "invalid_request_error")
    return [*stored[0], *stored[1]["output"], *items]


def _output(sim: Simulator, body: dict[str, Any], calls: list[dict]) -> list[dict[str, Any]]:
    """What the model answers: a reasoning item when asked to reason, then tool calls or a message."""
    n, out = sim.next_id(), cast(list[dict[str, Any]], [])
    reasoned = body.get("reasoning") is not None
    if reasoned:
        item: dict[str, Any] = {"id": f"rs_sim{n:08d}", "type": "reasoning", "summary": []}
        if "reasoning.encrypted_content" in (body.get("include") or []):
            item["encrypted_content"] = seal(item["id"], REASONING)
        out.append(item)
    marker = "r" if reasoned else ""
    for i, call in enumerate(calls):
        function = call["function"]
        out.append(
            {"id": f"fc_{marker}sim{n:08d}_{i}", "type": "function_call", "status": "completed",
             "arguments": function["arguments"], "call_id": call["id"], "name": function["name"]}
        )  # fmt: skip
    if not calls:
        text = {"type": "output_text", "annotations": [], "logprobs": [], "text": sim.config.answer}
        out.append(
            {"id": f"msg_{marker}sim{n:08d}", "type": "message", "status": "completed", "content": [text],
             "role": "assistant"}
        )  # fmt: skip
    return out


def _usage(prompt: int, cached: int, completion: int, reasoning: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion + reasoning, "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion + reasoning,
    }  # fmt: skip


def _response(sim: Simulator, body: dict[str, Any]) -> dict[str, Any]:
    """The response object before it has output (`response.created`); the final one adds output and usage."""
    keys = ("instructions", "max_output_tokens", "previous_response_id", "prompt_cache_key", "reasoning", "user")
    return {
        "id": f"resp_sim{sim.next_id():08d}", "object": "response", "created_at": int(time.time()),
        "status": "in_progress", "background": False, "error": None, "incomplete_details": None,
        **{key: body.get(key) for key in keys}, "metadata": body.get("metadata") or {}, "model": body["model"],
        "output": [], "parallel_tool_calls": body.get("parallel_tool_calls", True), "store": body.get("store", True),
        "temperature": 1.0, "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [], "top_p": 1.0,
        "truncation": "disabled", "usage": None,
    }  # fmt: skip


async def create_response(request: web.Request) -> web.StreamResponse:
    sim, body = request.app[SIMULATOR], request[BODY]
    sim.totals.requests += 1
    if (error := _request_error(body)) is not None:
        return error
    items = _with_history(request, body)
    if isinstance(items, web.Response):
        return items
    model, tools = body["model"], [t for t in body.get("tools") or [] if t.get("type") == "function"]
    try:
        prompt, chain = sim.measure(model, body.get("tools") or None, input_messages({**body, "input": items}))
    except TypeError:  # orjson refuses JSON nested over 254 deep; so does the API
        return _error("Invalid 'input': nested too deeply.")
    response = _response(sim, body)
    if prompt + (body.get("max_output_tokens") or 0) > sim.config.window(model):
        sim.totals.refused += 1
        if body.get("stream"):
            return await _refuse_stream(request, response)
        return _error(WINDOW_MESSAGE, "context_length_exceeded")
    key = request.headers.get("Authorization", "")
    cached = min(sim.cached_tokens(key, chain), prompt)
    sim.remember(key, chain)
    n_calls = int(number_header(request, "X-Sim-Tool-Calls", sim.config.tool_calls)) if tools else 0
    calls = tool_calls([{"function": t} for t in tools], n_calls, sim.next_id()) if n_calls > 0 else []
    output = _output(sim, body, calls)
    counter = counter_for(encoding_for_model(model))
    completion = sum(counter.count_text(i.get("arguments") or sim.config.answer) for i in output if "call_id" in i)
    completion += 0 if calls else counter.count_text(sim.config.answer)
    reasoning = counter.count_text(REASONING) if body.get("reasoning") is not None else 0
    usage = _usage(prompt, cached, completion, reasoning)
    sim.totals.answered += 1
    sim.totals.prompt_tokens += prompt
    sim.totals.cached_tokens += cached
    sim.totals.completion_tokens += completion + reasoning
    final = {**response, "status": "completed", "output": output, "usage": usage}
    if body.get("store") is not False:
        request.app[STORED][final["id"]] = (items, final)
    if body.get("stream"):
        chunks = max(1, int(number_header(request, "X-Sim-Chunks", sim.config.chunks)))
        return await _stream(request, _events(response, final, chunks))
    return await send_json(request, final)


def _pieces(text: str, n: int) -> list[str]:
    n = max(1, min(n, len(text)))
    return [text[len(text) * k // n : len(text) * (k + 1) // n] for k in range(n)]


def _item_events(index: int, item: dict[str, Any], chunks: int) -> list[dict[str, Any]]:
    """The events that stream one output item: added, its deltas, done."""
    at = {"output_index": index}
    opened = {**item, "status": "in_progress"}
    if item["type"] == "function_call":
        opened["arguments"] = ""
    elif item["type"] == "message":
        opened["content"] = []
    events = [{"type": "response.output_item.added", **at, "item": opened}]
    if item["type"] == "function_call":
        ref = {"item_id": item["id"], **at}
        events += [{"type": "response.function_call_arguments.delta", **ref, "delta": piece}
                   for piece in _pieces(item["arguments"], chunks)]  # fmt: skip
        events.append({"type": "response.function_call_arguments.done", **ref, "arguments": item["arguments"]})
    elif item["type"] == "message":
        part, text = item["content"][0], item["content"][0]["text"]
        ref = {"item_id": item["id"], **at, "content_index": 0}
        events.append({"type": "response.content_part.added", **ref, "part": {**part, "text": ""}})
        events += [{"type": "response.output_text.delta", **ref, "delta": piece, "logprobs": []}
                   for piece in _pieces(text, chunks)]  # fmt: skip
        events.append({"type": "response.output_text.done", **ref, "text": text, "logprobs": []})
        events.append({"type": "response.content_part.done", **ref, "part": part})
    return [*events, {"type": "response.output_item.done", **at, "item": item}]


def _events(response: dict[str, Any], final: dict[str, Any], chunks: int) -> list[dict[str, Any]]:
    events = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
    ]
    for index, item in enumerate(final["output"]):
        events += _item_events(index, item, chunks)
    return [*events, {"type": "response.completed", "response": final}]


async def _stream(request: web.Request, events: list[dict[str, Any]]) -> web.StreamResponse:
    """Each event as `event: <type>` + `data: <json>`, numbered as the real API numbers them."""
    sim = request.app[SIMULATOR]
    pieces = []
    for number, event in enumerate(events):
        event = {"type": event["type"], "sequence_number": number, **event}
        pieces.append(b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n")
    delay = number_header(request, "X-Sim-Delay-Ms", sim.config.chunk_delay_s * 1000) / 1000
    return await send(request, pieces, "text/event-stream", sim.config.fault_after_chunks, delay)


async def _refuse_stream(request: web.Request, response: dict[str, Any]) -> web.StreamResponse:
    """A streamed request over the window: 200, `response.created`, then the refusal as events."""
    error = {"code": "context_length_exceeded", "message": WINDOW_MESSAGE}
    failed = {**response, "status": "failed", "error": error}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
        {"type": "error", **error, "param": "input"},
        {"type": "response.failed", "response": failed},
    ]
    return await _stream(request, events)


async def stored_response(request: web.Request) -> web.StreamResponse:
    """GET (or DELETE) /v1/responses/{id}, GET …/input_items, POST …/cancel: what the API keeps when `store`."""
    response_id, tail = request.match_info["response_id"], request.match_info.get("tail", "")
    stored = request.app[STORED].get(response_id)
    if stored is None:
        return openai_error(404, f"Response with id '{response_id}' not found.", "invalid_request_error")
    if tail == "input_items":
        data = [item for item in stored[0] if isinstance(item, dict)]
        return await send_json(request, {"object": "list", "data": data, "has_more": False})
    if tail == "cancel":
        return _error("Only responses created with background=true can be cancelled.", param=None)
    if request.method == "DELETE":
        del request.app[STORED][response_id]
        return await send_json(request, {"id": response_id, "object": "response.deleted", "deleted": True})
    return await send_json(request, stored[1])


async def compact(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses/compact: the input folded into one opaque compaction item."""
    body = request[BODY]
    if (error := _request_error(body)) is not None:
        return error
    sim = request.app[SIMULATOR]
    item_id = f"cmp_sim{sim.next_id():08d}"
    output = [{"id": item_id, "type": "compaction", "encrypted_content": seal(item_id, "compacted")}]
    return await send_json(request, {"id": f"resp_sim{sim.next_id():08d}", "object": "response.compaction",
                                     "output": output, "usage": _usage(0, 0, 0, 0)})  # fmt: skip


async def websocket_mode(request: web.Request) -> web.StreamResponse:
    """GET /v1/responses upgraded (Codex's WebSocket mode): each `response.create` answered with its events."""
    sim, socket = request.app[SIMULATOR], web.WebSocketResponse()
    await socket.prepare(request)
    async for message in socket:
        body = orjson.loads(message.data) if message.type == web.WSMsgType.TEXT else None
        if (
            not isinstance(body, dict)
            or body.get("type") != "response.create"
            or not isinstance(body.get("model"), str)
        ):
            await socket.send_str(orjson.dumps({"type": "error", "code": "invalid_request", "message": "bad"}).decode())
            continue
        response = _response(sim, body)
        final = {**response, "status": "completed", "output": _output(sim, body, []), "usage": _usage(0, 0, 0, 0)}
        for number, event in enumerate(_events(response, final, 1)):
            await socket.send_str(orjson.dumps({"sequence_number": number, **event}).decode())
    return socket


def add_routes(app: web.Application) -> None:
    """The Responses routes, on a simulator app."""
    app[STORED] = {}
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses", websocket_mode)
    app.router.add_post("/v1/responses/compact", compact)
    app.router.add_route("*", "/v1/responses/{response_id}", stored_response)
    app.router.add_route("*", "/v1/responses/{response_id}/{tail}", stored_response)
