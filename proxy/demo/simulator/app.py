"""The simulator's routes: chat completions (answers, streams, tool calls, recorded replays), models, embeddings."""

from __future__ import annotations

import base64
import hashlib
import struct
import time
from typing import Any

import orjson
from aiohttp import web

from proxy.context.tokens import canonical_bytes
from proxy.demo.simulator import messages, responses
from proxy.demo.simulator.answers import (
    FINGERPRINT,
    billed_usage,
    chunk_choices,
    openai_error,
    request_error,
    structured_answer,
    tool_calls,
    window_error,
)
from proxy.demo.simulator.faults import BODY, number_header, record_and_fault, send, send_json
from proxy.demo.simulator.model import SIMULATOR, Simulator, SimulatorConfig
from proxy.tokens.counter import counter_for, encoding_for_model


async def chat_completions(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIMULATOR]
    body = request[BODY]
    sim.totals.requests += 1
    error = request_error(body)
    if error is not None:
        return error
    if (name := request.headers.get("X-Sim-Recorded")) is not None:
        return await _replay(request, name)
    model, messages, tools = body["model"], body["messages"], body.get("tools") or None
    try:
        prompt, chain = sim.measure(model, tools, messages)
    except TypeError:  # orjson refuses JSON nested over 254 deep; OpenAI refuses such a body too
        return openai_error(400, "Invalid 'messages': nested too deeply.", "invalid_request_error", param="messages")
    window = sim.config.window(model)
    reserved = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    if prompt + reserved > window:
        sim.totals.refused += 1
        return window_error(window, prompt, reserved)
    key = request.headers.get("Authorization", "")
    cached = min(sim.cached_tokens(key, chain), prompt)
    sim.remember(key, chain)

    n_calls = int(number_header(request, "X-Sim-Tool-Calls", sim.config.tool_calls)) if tools else 0
    calls = tool_calls(tools, n_calls, sim.next_id()) if tools and n_calls > 0 else []
    content = None if calls else structured_answer(body.get("response_format")) or sim.config.answer
    counter = counter_for(encoding_for_model(model))
    completion = counter.count_text(content or "") + sum(
        counter.count_text(c["function"]["name"] + c["function"]["arguments"]) for c in calls
    )
    usage = billed_usage(prompt, cached, completion)
    sim.totals.answered += 1
    sim.totals.prompt_tokens += prompt
    sim.totals.cached_tokens += cached
    sim.totals.completion_tokens += completion
    base = {"id": f"chatcmpl-sim{sim.next_id():08d}", "created": int(time.time()), "model": model}
    if body.get("stream"):
        chunks = max(1, int(number_header(request, "X-Sim-Chunks", sim.config.chunks)))
        return await _stream(request, base, chunk_choices(content, calls, chunks), usage)
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
    if calls:
        message["tool_calls"] = calls
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls" if calls else "stop"}
    payload = {"id": base["id"], "object": "chat.completion", "created": base["created"], "model": base["model"]}
    payload.update(choices=[choice], usage=usage)
    return await send_json(request, {**payload, "service_tier": "default", "system_fingerprint": FINGERPRINT})


async def _stream(request: web.Request, base: dict, choices: list[list[dict]], usage: dict) -> web.StreamResponse:
    """SSE as the real API sends it: one event per chunk, then usage if asked for, then [DONE]."""
    sim = request.app[SIMULATOR]
    head = {"id": base["id"], "object": "chat.completion.chunk", "created": base["created"], "model": base["model"]}
    head["system_fingerprint"] = FINGERPRINT
    events = [{**head, "choices": c} for c in choices]
    if (request[BODY].get("stream_options") or {}).get("include_usage"):
        events.append({**head, "choices": [], "usage": usage})
    pieces = [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
    delay = number_header(request, "X-Sim-Delay-Ms", sim.config.chunk_delay_s * 1000) / 1000
    return await send(request, pieces, "text/event-stream", sim.config.fault_after_chunks, delay)


async def _replay(request: web.Request, name: str) -> web.StreamResponse:
    """A stream recorded from the real API, sent event by event as it was captured."""
    sim = request.app[SIMULATOR]
    recorded = sim.config.recorded_streams.get(name)
    if recorded is None:
        known = sorted(sim.config.recorded_streams)
        return openai_error(400, f"unknown X-Sim-Recorded {name!r}; known: {known}", "invalid_request_error")
    sim.totals.answered += 1
    events = [event + b"\n\n" for event in recorded.split(b"\n\n")]
    events[-1] = events[-1].removesuffix(b"\n\n")  # what followed the last separator, if anything
    pieces = [event for event in events if event]
    delay = number_header(request, "X-Sim-Delay-Ms", sim.config.chunk_delay_s * 1000) / 1000
    return await send(request, pieces, "text/event-stream", sim.config.fault_after_chunks, delay)


async def list_models(request: web.Request) -> web.StreamResponse:
    models = request.app[SIMULATOR].config.models
    rows = [_model_object(name) for name in models]
    return await send_json(request, {"object": "list", "data": rows})


async def retrieve_model(request: web.Request) -> web.StreamResponse:
    """`GET /v1/models/{id}`: the model object, or OpenAI's 404 for a model the simulator does not serve."""
    name = request.match_info["model"]
    if name not in request.app[SIMULATOR].config.models:
        message = f"The model `{name}` does not exist or you do not have access to it."
        return openai_error(404, message, "invalid_request_error", "model_not_found")
    return await send_json(request, _model_object(name))


def _model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 1715367049, "owned_by": "system"}


async def embeddings(request: web.Request) -> web.StreamResponse:
    """Deterministic unit vectors from a hash of each input, as floats or base64 like the real API."""
    body, sim = request[BODY], request.app[SIMULATOR]
    if not isinstance(body, dict) or "input" not in body:
        return openai_error(400, "'input' is a required property", "invalid_request_error")
    items = body["input"] if isinstance(body["input"], list) and body["input"] else [body["input"]]
    if all(isinstance(x, int) for x in items):
        items = [items]
    dims = int(body.get("dimensions") or sim.config.embedding_dims)
    counter = counter_for(encoding_for_model(str(body.get("model", ""))))
    data, tokens = [], 0
    for i, item in enumerate(items):
        tokens += len(item) if isinstance(item, list) else counter.count_text(str(item))
        seed = hashlib.blake2b(canonical_bytes(item), digest_size=64).digest()
        raw = [(seed[k % 64] - 127.5) / 127.5 for k in range(dims)]
        norm = sum(v * v for v in raw) ** 0.5 or 1.0
        vector = [v / norm for v in raw]
        embedding: list[float] | str = vector
        if body.get("encoding_format") == "base64":
            embedding = base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return await send_json(request, {"object": "list", "data": data, "model": body.get("model"), "usage": usage})


async def not_found(request: web.Request) -> web.Response:
    return openai_error(404, f"Invalid URL ({request.method} {request.path})", "invalid_request_error")


async def _add_extra_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(request.app[SIMULATOR].config.extra_headers)


def create_simulator_app(config: SimulatorConfig | None = None) -> web.Application:
    """The simulator as an aiohttp app; its state is `app[SIMULATOR]` (requests, totals, reset())."""
    app = web.Application(middlewares=[record_and_fault], client_max_size=256 * 1024 * 1024)
    app[SIMULATOR] = Simulator(config or SimulatorConfig())
    app.on_response_prepare.append(_add_extra_headers)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", retrieve_model)
    app.router.add_post("/v1/embeddings", embeddings)
    messages.add_routes(app)
    responses.add_routes(app)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


async def start_simulator(
    config: SimulatorConfig | None = None, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Serve the simulator; returns the runner (`runner.app[SIMULATOR]`) and its base URL ending in /v1."""
    runner = web.AppRunner(
        create_simulator_app(config), handler_cancellation=True, shutdown_timeout=0.5, access_log=None
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}/v1"
