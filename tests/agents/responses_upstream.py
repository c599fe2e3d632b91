"""A scripted Responses upstream for the real Codex CLI: it plays the model, Codex runs the commands.

Each POST /v1/responses is answered from the script by how many tool outputs the input holds:
one signed reasoning item and an `exec_command` call for the next command, then, when the script
is done, a final answer computed from the last output it received (so the answer proves the agent
really ran the commands). It streams the events Codex reads (`response.created`,
`response.output_item.done`, `response.completed` with usage) and holds the connection a moment
after the last event, as a real server's keep-alive does (Codex hangs up at `response.completed`).

It bills like OpenAI: every input token counted with the o200k encoding, the longest prefix shared
with the session's previous request (in whole items, 128-token blocks, from 1024 tokens on) as
cached; it refuses a request over its window with `context_length_exceeded`, and the WebSocket
upgrade with 426 as a server without WebSocket mode does. Everything it received is kept for the
test to judge: bodies, headers, the reasoning items it issued.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.tokens.counter import counter_for

CACHE_BLOCK, CACHE_MIN = 128, 1024
FINAL_PREFIX = "FINAL:"


@dataclass
class Received:
    """One request as the upstream saw it."""

    headers: dict[str, str]
    raw: bytes
    body: dict[str, Any]
    prompt_tokens: int = 0
    cached_tokens: int = 0
    refused: bool = False


@dataclass
class ScriptedResponses:
    """The model's side of a session: `commands` run one by one, then the final answer."""

    commands: Sequence[str]
    window: int = 400_000
    linger_s: float = 0.05  # the connection held open after `response.completed`
    received: list[Received] = field(default_factory=list)
    upgrades: int = 0
    issued: dict[str, dict[str, Any]] = field(default_factory=dict)  # reasoning id -> the item as sent
    _previous: dict[str, list[int]] = field(default_factory=dict)  # session -> per-item digests of its last input

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            self.upgrades += 1
            return web.Response(status=426, text="Upgrade Required: this server speaks HTTP only.")
        if request.method != "POST" or not request.path.endswith("/responses"):
            return web.json_response({"error": {"message": "not found", "type": "invalid_request_error"}}, status=404)
        raw = await request.read()
        body = orjson.loads(raw)
        seen = Received(dict(request.headers), raw, body)
        self.received.append(seen)
        seen.prompt_tokens, seen.cached_tokens = self._bill(request, body)
        if seen.prompt_tokens > self.window:
            seen.refused = True
            message = f"Your input exceeds the context window of this model ({seen.prompt_tokens} tokens)."
            error = {"message": message, "type": "invalid_request_error", "param": "input"}
            return web.json_response({"error": {**error, "code": "context_length_exceeded"}}, status=400)
        return await self._answer(request, body, seen)

    def _bill(self, request: web.Request, body: dict[str, Any]) -> tuple[int, int]:
        counter = counter_for("o200k_base")
        head = orjson.dumps([body.get("instructions"), body.get("tools")]).decode()
        items = body.get("input") if isinstance(body.get("input"), list) else [body.get("input")]
        tokens = [counter.count_text(head)] + [counter.count_text(orjson.dumps(item).decode()) for item in items]
        digests = [hash(head)] + [hash(orjson.dumps(item)) for item in items]
        key = str(body.get("prompt_cache_key") or request.headers.get("session-id") or "")
        before = self._previous.get(key, [])
        shared = 0
        while shared < min(len(before), len(digests)) and before[shared] == digests[shared]:
            shared += 1
        self._previous[key] = digests
        prompt = sum(tokens)
        cached = sum(tokens[:shared]) // CACHE_BLOCK * CACHE_BLOCK
        return prompt, cached if cached >= CACHE_MIN else 0

    def _output(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        items = body.get("input") if isinstance(body.get("input"), list) else []
        outputs = [item for item in items if item.get("type") == "function_call_output"]
        # The next step follows the newest output (a proxy may have dropped older ones, never the newest).
        step = max((int(str(item.get("call_id")).rsplit("_", 1)[-1]) + 1 for item in outputs), default=0)
        if step >= len(self.commands):
            last = str(outputs[-1].get("output", "")) if outputs else ""
            last = last.split("\nOutput:\n", 1)[-1]  # what the command printed, not Codex's header (chunk id, time)
            digest = hashlib.sha256(last.encode()).hexdigest()[:12]
            text = f"{FINAL_PREFIX} ran {step} commands; the last output had {last.count(chr(10))} lines ({digest})."
            content = [{"type": "output_text", "text": text, "annotations": []}]
            return [
                {"type": "message", "id": f"msg_{step}", "role": "assistant", "status": "completed", "content": content}
            ]
        reasoning = {
            "type": "reasoning",
            "id": f"rs_{step}",
            "summary": [{"type": "summary_text", "text": f"Step {step}: run the next command."}],
            "encrypted_content": "gAAAAB" + hashlib.sha256(f"sealed {step}".encode()).hexdigest() * 8,
        }
        self.issued[reasoning["id"]] = reasoning
        arguments = orjson.dumps({"cmd": self.commands[step], "yield_time_ms": 10000}).decode()
        call = {"type": "function_call", "id": f"fc_{step}", "call_id": f"call_{step}", "name": "exec_command"}
        return [reasoning, {**call, "arguments": arguments, "status": "completed"}]

    async def _answer(self, request: web.Request, body: dict[str, Any], seen: Received) -> web.StreamResponse:
        number = len(self.received)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        created = {"id": f"resp_{number}", "object": "response", "status": "in_progress", "model": body.get("model")}
        await response.write(_event("response.created", response={**created, "output": []}))
        output = self._output(body)
        for index, item in enumerate(output):
            await response.write(_event("response.output_item.added", output_index=index, item=item))
            await response.write(_event("response.output_item.done", output_index=index, item=item))
        usage = {
            "input_tokens": seen.prompt_tokens,
            "input_tokens_details": {"cached_tokens": seen.cached_tokens},
            "output_tokens": 40,
            "output_tokens_details": {"reasoning_tokens": 20},
            "total_tokens": seen.prompt_tokens + 40,
        }
        done = {**created, "status": "completed", "output": output, "usage": usage}
        await response.write(_event("response.completed", response=done))
        await asyncio.sleep(self.linger_s)
        await response.write_eof()
        return response

    def answered(self) -> list[Received]:
        return [r for r in self.received if not r.refused]


def _event(kind: str, **data: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"
