"""Fixtures for the HTTP shell: a scriptable local upstream and a proxy in front of it, all on 127.0.0.1.

The fake upstream picks its behaviour from the request's `model` (chat) or path, so tests drive
it through the official SDK unchanged: "echo", "tools", "paced", "recorded:<file>", "silent",
"hang-mid-stream", "die-mid-stream", "status:<code>", "overflow".
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from proxy.config import ConfigHolder, load_settings
from proxy.server import start

SSE_DIR = Path(__file__).parent / "data" / "sse"
PACE_S = 0.08  # between the chunks of a "paced" stream
PACED_CHUNKS = 5


@dataclass
class Seen:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeUpstream:
    """What the upstream saw, and events tests wait on."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    first_body_chunk: asyncio.Event = field(default_factory=asyncio.Event)
    overflow_refused: int = 0

    @property
    def last(self) -> Seen:
        return self.seen[-1]


def _chunk(model: str, delta: dict, finish: str | None = None) -> bytes:
    event = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(event) + b"\n\n"


USAGE = {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}


def _completion(model: str, message: dict, finish: str) -> dict:
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [choice],
        "usage": USAGE,
    }


async def _stream(request: web.Request, events: list[bytes], pace: float, hang_after: int | None = None):
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Upstream": "fake"})
    await response.prepare(request)
    for i, event in enumerate(events):
        if i == hang_after:
            await asyncio.sleep(3600)
        if i and pace:
            await asyncio.sleep(pace)
        await response.write(event)
    return response


def _stream_events(body: dict) -> list[bytes]:
    model = body["model"]
    if model == "tools":
        call = {**TOOL_CALL, "index": 0}
        events = [_chunk(model, {"role": "assistant", "tool_calls": [call]}), _chunk(model, {}, "tool_calls")]
    else:
        words = ["Hello", " from", " the", " fake", " upstream"][:PACED_CHUNKS]
        events = [_chunk(model, {"role": "assistant", "content": w}) for w in words] + [_chunk(model, {}, "stop")]
    if (body.get("stream_options") or {}).get("include_usage"):
        usage_event = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": model}
        events.append(b"data: " + orjson.dumps({**usage_event, "choices": [], "usage": USAGE}) + b"\n\n")
    return [*events, b"data: [DONE]\n\n"]


async def _recorded(request: web.Request, name: str) -> web.StreamResponse:
    """A recorded stream sent in odd-sized pieces, so events straddle reads."""
    data = (SSE_DIR / name).read_bytes()
    sizes, pieces, at = (1, 7, 13, 64, 3, 211, 2, 997), [], 0
    while at < len(data):
        size = sizes[len(pieces) % len(sizes)]
        pieces.append(data[at : at + size])
        at += size
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i, piece in enumerate(pieces):
        await response.write(piece)
        if i % 4 == 0:
            await asyncio.sleep(0.001)
    return response


def _error(status: int, message: str, code: str, headers: dict | None = None) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


async def _chat(request: web.Request, fake: FakeUpstream, body: dict) -> web.StreamResponse:
    model = body.get("model", "echo")
    if model.startswith("status:"):
        status = int(model.split(":")[1])
        headers = {"retry-after": "7", "x-ratelimit-remaining-requests": "0"} if status == 429 else None
        return _error(status, f"fake upstream says {status}", f"fake_{status}", headers)
    if model == "overflow" and not body.get("refitted"):
        fake.overflow_refused += 1
        message = "This model's maximum context length is 4096 tokens. However, your messages resulted in 5000 tokens."
        return _error(400, message, "context_length_exceeded")
    if model == "silent":
        await asyncio.sleep(3600)
    if model.startswith("recorded:"):
        return await _recorded(request, model.split(":", 1)[1])
    if body.get("stream"):
        events = _stream_events(body)
        if model == "die-mid-stream":
            response = await _stream(request, events[:2], 0)
            request.transport.close()
            return response
        hang = 1 if model == "hang-mid-stream" else None
        return await _stream(request, events, PACE_S if model == "paced" else 0, hang)
    if model == "tools":
        message = {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}
        return web.json_response(_completion(model, message, "tool_calls"))
    return web.json_response(
        _completion(model, {"role": "assistant", "content": "Hello from the fake upstream"}, "stop")
    )


def create_fake_upstream(fake: FakeUpstream) -> web.Application:
    @web.middleware
    async def record(request: web.Request, handler):
        chunks = []
        async for chunk in request.content.iter_any():
            fake.first_body_chunk.set()
            chunks.append(chunk)
        fake.seen.append(Seen(request.method, request.raw_path, dict(request.headers), b"".join(chunks)))
        try:
            return await handler(request)
        except asyncio.CancelledError:
            fake.cancelled.set()
            raise

    async def chat(request: web.Request) -> web.StreamResponse:
        return await _chat(request, fake, orjson.loads(fake.last.body))

    async def models(request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "echo", "object": "model", "created": 1, "owned_by": "fake"}]}
        )

    async def embeddings(request: web.Request) -> web.Response:
        body = orjson.loads(fake.last.body)
        data = [{"object": "embedding", "index": 0, "embedding": [0.5, 0.25]}]
        return web.json_response(
            {"object": "list", "data": data, "model": body["model"], "usage": {"prompt_tokens": 2, "total_tokens": 2}}
        )

    async def echo(request: web.Request) -> web.Response:
        seen = fake.last
        return web.json_response(
            {
                "method": seen.method,
                "path_qs": seen.path_qs,
                "length": len(seen.body),
                "sha256": hashlib.sha256(seen.body).hexdigest(),
            },
            headers={"X-Echo": "1", "Connection": "keep-alive", "Keep-Alive": "timeout=5"},
        )

    app = web.Application(middlewares=[record], client_max_size=1024**3)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_route("*", "/v1/echo{tail:.*}", echo)
    return app


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    runner = web.AppRunner(create_fake_upstream(fake), handler_cancellation=True, shutdown_timeout=0.1, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    yield fake
    await runner.cleanup()


@dataclass
class RunningProxy:
    url: str  # ends in /v1, for the SDK's base_url
    root: str  # http://127.0.0.1:PORT
    holder: ConfigHolder


MakeProxy = Callable[..., Awaitable[RunningProxy]]


@pytest.fixture
async def make_proxy() -> AsyncIterator[MakeProxy]:
    """`await make_proxy(upstream_url, context=..., max_body_mb=..., api_key_env=..., read_timeout_s=...)`."""
    runners: list[web.AppRunner] = []

    async def make(upstream_url: str, *, context: Any = None, **overrides: Any) -> RunningProxy:
        settings = load_settings(None, upstream_url)
        server_keys = {k: v for k, v in overrides.items() if hasattr(settings.server, k)}
        upstream_keys = {k: v for k, v in overrides.items() if hasattr(settings.upstream, k)}
        settings = replace(
            settings,
            server=replace(settings.server, **server_keys),
            upstream=replace(settings.upstream, **upstream_keys),
        )
        holder = ConfigHolder(settings, upstream_url)
        runner, port = await start(holder, "127.0.0.1", 0, context=context)
        runners.append(runner)
        root = f"http://127.0.0.1:{port}"
        return RunningProxy(f"{root}/v1", root, holder)

    yield make
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def proxy(upstream: FakeUpstream, make_proxy: MakeProxy) -> RunningProxy:
    return await make_proxy(upstream.url)


@dataclass
class RecordingTurn:
    """A PreparedTurn that keeps what the shell told it."""

    body: dict
    headers: dict[str, str]
    strip_usage_chunk: bool = False
    usages: list[dict] = field(default_factory=list)
    refits: list[int] = field(default_factory=list)
    refit_body: dict | None = None

    def record_usage(self, usage: dict) -> None:
        self.usages.append(usage)

    def refit(self, reported_prompt_tokens: int) -> dict | None:
        self.refits.append(reported_prompt_tokens)
        return self.refit_body


@dataclass
class RecordingService:
    """A ContextService for tests: adds headers, may strip usage, refit, reject or crash."""

    strip_usage_chunk: bool = False
    refit: bool = True
    fail_with: Exception | None = None
    turns: list[RecordingTurn] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)

    def prepare(self, *, path_session, headers, body, credential) -> RecordingTurn:
        self.calls.append({"path_session": path_session, "credential": credential, "body": body})
        if self.fail_with is not None:
            raise self.fail_with
        if self.strip_usage_chunk and body.get("stream"):
            body = {**body, "stream_options": {"include_usage": True}}
        refit_body = {**body, "refitted": True} if self.refit else None
        turn = RecordingTurn(
            body,
            {"X-Context-Tokens-Before": "100", "X-Context-Tokens-After": "60"},
            self.strip_usage_chunk,
            refit_body=refit_body,
        )
        self.turns.append(turn)
        return turn

    def sessions_json(self) -> list[dict]:
        return [{"id": c["path_session"]} for c in self.calls]

    def session_json(self, session_id: str) -> dict | None:
        return {"id": session_id} if any(c["path_session"] == session_id for c in self.calls) else None


MESSAGES_FOR_ERRORS = [{"role": "user", "content": "Say hello."}]
