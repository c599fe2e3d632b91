"""A scripted Messages upstream for the real Claude Code: it plays the model, Claude Code runs the commands.

Each POST /v1/messages is answered from the script by the newest `tool_result` the request holds:
a signed thinking block and a `Bash` tool_use for the next command (or, at `agent_at`, an `Agent`
call that starts a subagent with its own commands), then, when the script is done, a final answer
computed from the last output it received (so the answer proves the agent really ran them). A
request whose first user message carries `SUBAGENT_TASK` is the subagent's conversation; one that
offers no Bash tool is a side request (a title, a summary) and gets a line of text.

It checks and bills as the proxy's simulator does Anthropic (proxy/demo/simulator/messages.py:
roles, tool_use/tool_result pairing, thinking signatures, breakpoints; cache reads and writes by the
request's `cache_control`, Claude's count as tiktoken's × 1.12) and refuses a prompt over its window
with Anthropic's `prompt is too long`. Everything it received is kept for the test to judge.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.demo.simulator.blocks import blocks_of, measure, sign
from proxy.demo.simulator.messages import anthropic_error, bill, message_events, request_problem
from proxy.demo.simulator.model import Simulator, SimulatorConfig

FINAL_PREFIX = "FINAL:"
SUBAGENT_TASK = "SUBAGENT TASK: run the commands the model asks for, then report."
SUBAGENT_PREFIX = "SUBAGENT DONE:"
MAIN, SUB, SIDE = "main", "subagent", "side"
_REMINDER = re.compile(r"\s*<system-reminder>.*?</system-reminder>", re.DOTALL)


@dataclass
class Received:
    """One request as the upstream saw it."""

    headers: dict[str, str]
    raw: bytes
    body: dict[str, Any]
    kind: str = MAIN  # MAIN, SUB or SIDE
    prompt_tokens: int = 0
    usage: dict[str, Any] = field(default_factory=dict)
    refused: bool = False

    @property
    def cost_units(self) -> float:
        """Input as Anthropic bills it, in base-price tokens: uncached 1, cache writes 1.25, cache reads 0.1."""
        u = self.usage
        return u["input_tokens"] + 1.25 * u["cache_creation_input_tokens"] + 0.1 * u["cache_read_input_tokens"]


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        b
        for m in body.get("messages", [])
        if isinstance(m, dict) and m.get("role") == "user"
        for b in blocks_of(m.get("content"))
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]


def result_text(block: dict[str, Any]) -> str:
    """What a tool_result says, its text blocks joined, without the reminders Claude Code appends (some models get
    `<total_tokens>N tokens left</total_tokens>`, which differs between a direct and a proxied run)."""
    inner = block.get("content")
    if not isinstance(inner, str):
        inner = "\n".join(str(b.get("text", "")) for b in blocks_of(inner) if isinstance(b, dict))
    return _REMINDER.sub("", inner)


def step_of(body: dict[str, Any], kind: str) -> int:
    """How many of `kind`'s script steps the request shows done (the proxy may drop older results, never the newest)."""
    prefix = f"toolu_{kind}_"
    ids = [str(b.get("tool_use_id", "")) for b in tool_results(body)]
    return max((int(i.removeprefix(prefix)) + 1 for i in ids if i.startswith(prefix)), default=0)


def kind_of(body: dict[str, Any]) -> str:
    tools = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
    if "Bash" not in tools:
        return SIDE
    first = next((m for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "user"), {})
    texts = [str(b.get("text", "")) for b in blocks_of(first.get("content")) if isinstance(b, dict)]
    return SUB if any(SUBAGENT_TASK in t for t in texts) else MAIN


@dataclass
class ScriptedMessages:
    """The model's side of a Claude Code run: `commands` one by one (an Agent call at `agent_at`), then the answer."""

    commands: Sequence[str]
    subagent_commands: Sequence[str] = ()
    agent_at: int | None = None  # the main thread's step that starts the subagent (None: no subagent)
    window: int = 1_000_000
    received: list[Received] = field(default_factory=list)
    issued: dict[str, bytes] = field(default_factory=dict)  # thinking text -> the block as sent (JSON)
    sim: Simulator = field(default_factory=lambda: Simulator(SimulatorConfig()))

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    def steps(self, kind: str) -> int:
        return len(self.subagent_commands) if kind == SUB else len(self.commands) + (self.agent_at is not None)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method != "POST" or not request.path.startswith("/v1/messages"):
            return anthropic_error(404, f"Not found: {request.method} {request.path}", "not_found_error")
        raw = await request.read()
        body = orjson.loads(raw)
        if problem := request_problem(body):
            return anthropic_error(400, problem)
        prompt, chain = measure(body, self.sim.config.claude_token_ratio)
        if request.path.endswith("/count_tokens"):
            return web.json_response({"input_tokens": prompt})
        seen = Received(dict(request.headers), raw, body, kind_of(body), prompt)
        self.received.append(seen)
        if prompt > self.window:
            seen.refused = True
            return anthropic_error(400, f"prompt is too long: {prompt} tokens > {self.window} maximum")
        seen.usage = bill(self.sim, request, body, prompt, chain)
        content = self._content(body, seen.kind)
        seen.usage["output_tokens"] = 40
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        message = {
            "id": f"msg_{len(self.received):04d}", "type": "message", "role": "assistant", "model": body["model"],
            "content": content, "stop_reason": stop, "stop_sequence": None, "usage": seen.usage,
        }  # fmt: skip
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in message_events(message, 4):
            await response.write(b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n")
        await response.write_eof()
        return response

    def _content(self, body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
        if kind == SIDE:
            return [{"type": "text", "text": "Scripted session"}]
        step = step_of(body, kind)
        thought = f"{kind} step {step}: read the last output, decide what runs next."
        thinking = {"type": "thinking", "thinking": thought, "signature": sign(thought)}
        self.issued[thought] = orjson.dumps(thinking)
        if step >= self.steps(kind):
            results = [b for b in tool_results(body) if str(b.get("tool_use_id")).startswith(f"toolu_{kind}_")]
            last = result_text(results[-1]) if results else ""
            digest = hashlib.sha256(last.encode()).hexdigest()[:12]
            prefix = SUBAGENT_PREFIX if kind == SUB else FINAL_PREFIX
            text = f"{prefix} ran {step} steps; the last output had {last.count(chr(10))} lines ({digest})."
            return [thinking, {"type": "text", "text": text}]
        call = {"type": "tool_use", "id": f"toolu_{kind}_{step}"}
        if kind == MAIN and self.agent_at is not None and step == self.agent_at:
            task = {"description": "Run the side commands", "prompt": SUBAGENT_TASK, "subagent_type": "general-purpose"}
            return [thinking, {**call, "name": "Agent", "input": {**task, "run_in_background": False}}]
        commands = self.subagent_commands if kind == SUB else self.commands
        index = step - (1 if kind == MAIN and self.agent_at is not None and step > self.agent_at else 0)
        command = {"command": commands[index], "description": f"Run step {step}"}
        return [thinking, {**call, "name": "Bash", "input": command}]

    def answered(self) -> list[Received]:
        return [r for r in self.received if not r.refused]
