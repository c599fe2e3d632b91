"""An OpenAI-compatible upstream on localhost, for the tests, the demo and the benchmarks.

It answers and streams like the real API (format copied from tests/data/sse), bills
`usage` with `cached_tokens` from a prefix-cache model, refuses requests over the
model's window with OpenAI's exact error, checks tool-call pairing like OpenAI, and
misbehaves on request (`X-Sim-Fault`) so robustness tests have something to meet.
Its token count is the proxy's plus a hidden overhead, so estimates are close, not exact.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import struct
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.context.tokens import REPLY_PRIMING, canonical_bytes
from proxy.tokens import counter_for, encoding_for_model

FINGERPRINT = "fp_sim0c0ffee"
DEFAULT_ANSWER = (
    "I looked at the files you showed me. The failing test comes from the timezone conversion in the "
    "database backend: the value is converted twice when USE_TZ is enabled. I will patch the adapter "
    "so it converts once, then run the test suite again to confirm the fix and check for regressions."
)


@dataclass
class SimulatorConfig:
    """How the simulated upstream behaves. Header overrides: X-Sim-Delay-Ms, X-Sim-Chunks, X-Sim-Tool-Calls."""

    models: dict[str, int] = field(
        default_factory=lambda: {"sim-32k": 32000, "gpt-4o": 128000, "gpt-4o-mini": 128000, "gpt-5": 400000}
    )
    default_window: int = 128000  # for a model no entry names (entries match exactly or as a prefix)
    chunks: int = 16  # content deltas per streamed answer
    chunk_delay_s: float = 0.0  # pause between streamed chunks
    answer: str = DEFAULT_ANSWER
    tool_calls: int = 0  # answer with this many tool calls when the request offers tools
    hidden_tokens_per_message: int = 1  # chat-template framing the proxy cannot see
    hidden_tokens_per_tool: int = 8
    cache_min_tokens: int = 1024  # OpenAI: no cache hit below 1024 tokens ...
    cache_granularity: int = 128  # ... and hits in steps of 128
    cache_keys: int = 256  # API keys whose prefixes are remembered (LRU)
    cache_prefixes_per_key: int = 100_000
    record_limit: int = 1000  # requests kept in `Simulator.requests`
    silence_s: float = 3600.0  # the `silence` faults: longer than any timeout
    slow_headers_s: float = 0.5
    fault_after_chunks: int = 2  # mid-stream faults strike after this many chunks
    embedding_dims: int = 16

    def window(self, model: str) -> int:
        if model in self.models:
            return self.models[model]
        prefixes = [name for name in self.models if model.startswith(name)]
        return self.models[max(prefixes, key=len)] if prefixes else self.default_window


@dataclass
class RecordedRequest:
    method: str
    path: str  # with the query string
    headers: CIMultiDict[str]
    raw: bytes
    body: Any  # parsed JSON, or None


@dataclass
class SimTotals:
    """Running totals over chat completions, for savings reports."""

    requests: int = 0
    answered: int = 0
    refused: int = 0  # context_length_exceeded
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    disconnects: int = 0  # streams the client left before the end


class Simulator:
    """The app's state: config, recorded requests, totals and the prefix cache."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.requests: deque[RecordedRequest] = deque(maxlen=config.record_limit)
        self.totals = SimTotals()
        self.active_streams = 0
        self._ids = itertools.count(1)
        self._cache: OrderedDict[str, OrderedDict[bytes, None]] = OrderedDict()

    def reset(self) -> None:
        """Forget requests, totals and the prompt cache (between a direct and a proxied replay)."""
        self.requests.clear()
        self.totals = SimTotals()
        self._cache.clear()

    def next_id(self) -> int:
        return next(self._ids)

    def measure(self, model: str, tools: Any, messages: list[dict]) -> tuple[int, list[tuple[bytes, int]]]:
        """Prompt tokens as the upstream bills them, and the chain of (prefix digest, tokens so far)."""
        counter = counter_for(encoding_for_model(model))
        running = hashlib.blake2b(model.encode() + b"\0" + canonical_bytes(tools), digest_size=16)
        total = 0
        if tools:
            total = counter.count_text(json.dumps(tools)) + self.config.hidden_tokens_per_tool * len(tools)
        chain = [(running.digest(), total)]
        for message in messages:
            digest = hashlib.blake2b(canonical_bytes(message), digest_size=16).digest()
            total += counter.count_message(message, digest) + self.config.hidden_tokens_per_message
            running.update(digest)
            chain.append((running.digest(), total))
        return total + REPLY_PRIMING, chain

    def cached_tokens(self, key: str, chain: list[tuple[bytes, int]]) -> int:
        """The longest prefix an earlier request of this key shared, in OpenAI's cache steps."""
        seen = self._cache.get(key)
        longest = next((tokens for digest, tokens in reversed(chain) if seen and digest in seen), 0)
        if longest < self.config.cache_min_tokens:
            return 0
        return longest // self.config.cache_granularity * self.config.cache_granularity

    def remember(self, key: str, chain: list[tuple[bytes, int]]) -> None:
        seen = self._cache.pop(key, None) or OrderedDict()
        self._cache[key] = seen
        for digest, _ in chain:
            seen[digest] = None
            seen.move_to_end(digest)
        while len(seen) > self.config.cache_prefixes_per_key:
            seen.popitem(last=False)
        while len(self._cache) > self.config.cache_keys:
            self._cache.popitem(last=False)


SIMULATOR = web.AppKey("simulator", Simulator)
_BODY = web.RequestKey("sim_body", object)  # the request's parsed JSON, or None


MID_STREAM_FAULTS = frozenset({"reset-mid-stream", "silence-mid-stream", "malformed-sse"})
# fault -> (status, message, type, code, extra headers): the real API's bodies for these statuses.
_STATUS_FAULTS: dict[str, tuple[int, str, str, str | None, dict[str, str]]] = {
    "status-401": (401, "Incorrect API key provided: sk-sim.", "invalid_request_error", "invalid_api_key", {}),
    "status-429": (429, "Rate limit reached for requests.", "requests", "rate_limit_exceeded", {"retry-after": "1"}),
    "status-500": (500, "The server had an error while processing your request. Sorry about that!", "server_error",
                   None, {}),
}  # fmt: skip
_BAD_GATEWAY = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n</body>\r\n</html>\r\n"  # noqa: E501
FAULTS = (
    frozenset({"reset-before-headers", "silence", "slow-headers", "non-json-error", *_STATUS_FAULTS})
    | MID_STREAM_FAULTS
)


async def idle_while_connected(request: web.BaseRequest, seconds: float) -> bool:
    """Sleep up to `seconds`, waking early when the client hangs up; False if it did."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while (left := end - loop.time()) > 0:
        if request.transport is None or request.transport.is_closing():
            return False
        await asyncio.sleep(min(left, 0.02))
    return True


@web.middleware
async def _record_and_fault(request: web.Request, handler: Any) -> web.StreamResponse:
    """Record every request, then play the fault its `X-Sim-Fault` header asks for before any headers."""
    sim = request.app[SIMULATOR]
    raw = await request.read()
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        body = None
    request[_BODY] = body
    sim.requests.append(RecordedRequest(request.method, request.path_qs, CIMultiDict(request.headers), raw, body))
    fault = request.headers.get("X-Sim-Fault", "")
    if fault and fault not in FAULTS:
        return openai_error(400, f"unknown X-Sim-Fault {fault!r}; known: {sorted(FAULTS)}", "invalid_request_error")
    if fault == "slow-headers":
        await idle_while_connected(request, sim.config.slow_headers_s)
    elif fault == "silence":
        await idle_while_connected(request, sim.config.silence_s)
        return web.Response(status=204)
    elif fault == "reset-before-headers":
        _reset(request)
        return web.Response(status=204)
    elif fault == "non-json-error":
        return web.Response(status=502, text=_BAD_GATEWAY, content_type="text/html")
    elif fault in _STATUS_FAULTS:
        status, message, type_, code, headers = _STATUS_FAULTS[fault]
        return openai_error(status, message, type_, code, headers=headers)
    return await handler(request)


def _reset(request: web.BaseRequest, hard: bool = True) -> None:
    """Drop the connection: RST before headers; mid-body a plain close, so the bytes sent arrive first."""
    if request.transport is not None:
        request.transport.abort() if hard else request.transport.close()


def openai_error(
    status: int, message: str, type_: str, code: str | None = None, param: str | None = None, headers: Any = None
) -> web.Response:
    """An error exactly as the real API words and shapes it (key order included)."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers, dumps=lambda v: orjson.dumps(v).decode())


def pairing_error(messages: list[dict]) -> tuple[str, str] | None:
    """OpenAI's refusal (message, param) for tool results out of place or tool calls left unanswered."""
    calls_at, pending, open_calls = -1, [], set()
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
        open_calls = {c.get("id") for c in calls if isinstance(c, dict)} if calls else set()
        pending = [c.get("id") for c in calls if isinstance(c, dict)] if calls else []
    if pending:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            "'tool_call_id'. The following tool_call_ids did not have response messages: "
            + ", ".join(map(str, pending)),
            f"messages.[{calls_at}].role",
        )
    return None


def _request_error(body: Any) -> web.Response | None:
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
    problem = pairing_error(messages)
    return openai_error(400, problem[0], "invalid_request_error", param=problem[1]) if problem else None


def _window_error(window: int, prompt: int, completion: int) -> web.Response:
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


def _usage(prompt: int, cached: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
    }  # fmt: skip


def _sample(schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    return {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}.get(kind, "ls -la")


def _tool_calls(tools: list[Any], n: int, base: int) -> list[dict[str, Any]]:
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


def _chunk_choices(content: str | None, calls: list[dict], chunks: int) -> list[list[dict]]:
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


def _number_header(request: web.Request, name: str, default: float) -> float:
    try:
        return float(request.headers.get(name, default))
    except ValueError:
        return default


async def chat_completions(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIMULATOR]
    body = request[_BODY]
    sim.totals.requests += 1
    error = _request_error(body)
    if error is not None:
        return error
    model, messages, tools = body["model"], body["messages"], body.get("tools") or None
    try:
        prompt, chain = sim.measure(model, tools, messages)
    except TypeError:  # orjson refuses JSON nested over 254 deep; OpenAI refuses such a body too
        return openai_error(400, "Invalid 'messages': nested too deeply.", "invalid_request_error", param="messages")
    window = sim.config.window(model)
    reserved = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    if prompt + reserved > window:
        sim.totals.refused += 1
        return _window_error(window, prompt, reserved)
    key = request.headers.get("Authorization", "")
    cached = min(sim.cached_tokens(key, chain), prompt)
    sim.remember(key, chain)

    n_calls = int(_number_header(request, "X-Sim-Tool-Calls", sim.config.tool_calls)) if tools else 0
    calls = _tool_calls(tools, n_calls, sim.next_id()) if n_calls > 0 else []
    content = None if calls else sim.config.answer
    counter = counter_for(encoding_for_model(model))
    completion = counter.count_text(content or "") + sum(
        counter.count_text(c["function"]["name"] + c["function"]["arguments"]) for c in calls
    )
    usage = _usage(prompt, cached, completion)
    sim.totals.answered += 1
    sim.totals.prompt_tokens += prompt
    sim.totals.cached_tokens += cached
    sim.totals.completion_tokens += completion
    base = {"id": f"chatcmpl-sim{sim.next_id():08d}", "created": int(time.time()), "model": model}
    if body.get("stream"):
        chunks = max(1, int(_number_header(request, "X-Sim-Chunks", sim.config.chunks)))
        return await _stream(request, base, _chunk_choices(content, calls, chunks), usage)
    message = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
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
    if (request[_BODY].get("stream_options") or {}).get("include_usage"):
        events.append({**head, "choices": [], "usage": usage})
    pieces = [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
    delay = _number_header(request, "X-Sim-Delay-Ms", sim.config.chunk_delay_s * 1000) / 1000
    return await _send(request, pieces, "text/event-stream", sim.config.fault_after_chunks, delay)


def response_headers(sim: Simulator) -> dict[str, str]:
    return {"x-request-id": f"req_sim{sim.next_id():08d}", "openai-processing-ms": "1", "openai-version": "2020-10-01"}


async def send_json(request: web.Request, payload: Any) -> web.StreamResponse:
    """A JSON answer, sent in two halves so the mid-stream faults can break it between them."""
    data = orjson.dumps(payload)
    return await _send(request, [data[: len(data) // 2], data[len(data) // 2 :]], "application/json", 1, 0.0)


async def _send(
    request: web.Request, pieces: list[bytes], content_type: str, fault_at: int, delay: float
) -> web.StreamResponse:
    """Write the body piece by piece, paced by `delay`; the mid-stream faults strike before piece `fault_at`."""
    sim, fault = request.app[SIMULATOR], request.headers.get("X-Sim-Fault", "")
    sse = content_type == "text/event-stream"
    if fault == "malformed-sse" and fault_at < len(pieces):
        pieces[fault_at] = pieces[fault_at][: len(pieces[fault_at]) // 2] + (b"\n\n" if sse else b"")
    response = web.StreamResponse(headers=response_headers(sim))
    response.content_type, response.charset = content_type, "utf-8"
    if not sse:
        response.content_length = sum(map(len, pieces))
    await response.prepare(request)
    sim.active_streams += 1
    try:
        for i, piece in enumerate(pieces):
            if i == fault_at and fault == "reset-mid-stream":
                _reset(request, hard=False)
                return response
            if i == fault_at and fault == "silence-mid-stream":
                await idle_while_connected(request, sim.config.silence_s)
            if i and delay > 0 and not await idle_while_connected(request, delay):
                raise ConnectionResetError
            await response.write(piece)
        await response.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        sim.totals.disconnects += 1
        raise
    finally:
        sim.active_streams -= 1
    return response


async def list_models(request: web.Request) -> web.StreamResponse:
    models = request.app[SIMULATOR].config.models
    rows = [{"id": name, "object": "model", "created": 1715367049, "owned_by": "system"} for name in models]
    return await send_json(request, {"object": "list", "data": rows})


async def embeddings(request: web.Request) -> web.StreamResponse:
    """Deterministic unit vectors from a hash of each input, as floats or base64 like the real API."""
    body, sim = request[_BODY], request.app[SIMULATOR]
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
        if body.get("encoding_format") == "base64":
            vector = base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": vector})
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return await send_json(request, {"object": "list", "data": data, "model": body.get("model"), "usage": usage})


async def not_found(request: web.Request) -> web.Response:
    return openai_error(404, f"Invalid URL ({request.method} {request.path})", "invalid_request_error")


def create_simulator_app(config: SimulatorConfig | None = None) -> web.Application:
    """The simulator as an aiohttp app; its state is `app[SIMULATOR]` (requests, totals, reset())."""
    app = web.Application(middlewares=[_record_and_fault], client_max_size=256 * 1024 * 1024)
    app[SIMULATOR] = Simulator(config or SimulatorConfig())
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/embeddings", embeddings)
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
