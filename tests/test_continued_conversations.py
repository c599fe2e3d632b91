"""A Messages or Responses body's messages equal to the last body's take the engine messages mapped from them then
(`proxy.service.recent_conversations`): through a real server, every turn must send upstream the bytes a
reference engine sends that maps every message of every body anew.

Each packaged trace is posted turn by turn, as Claude Code sends it (its breakpoints on the system prompt and the
last message, moved every turn), as a Messages client that marks none, and as Codex sends the Responses API, to a
proxy in front of the simulator with every model's window cut to 32k: clearing, compaction and truncation all
happen. Then the client rewrites its history twice (an early result, then a whole turn gone). Beside it, in this
process, an engine service on the same config runs the same bodies with no conversation to continue.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.config.loader import ConfigHolder, load_settings
from proxy.demo.simulator import SIMULATOR, start_simulator
from proxy.demo.traces import list_traces, load_trace
from proxy.demo.traces_messages import messages_requests
from proxy.demo.traces_responses import responses_requests
from proxy.dialects import MESSAGES, RESPONSES, Dialect
from proxy.service.engine_service import EngineService, build_context_service
from proxy.shell import server

WINDOW = 32_000
KEY = "sk-continued"


@pytest.fixture
async def proxied() -> AsyncIterator[Callable[[], Any]]:
    """`await proxied()`: (the proxy's URL, its engine service, the simulator, a reference engine on its config)."""
    runners: list[Any] = []

    async def make() -> tuple[str, EngineService, Any, EngineService]:
        sim_runner, sim_url = await start_simulator()
        runners.append(sim_runner)
        settings = load_settings(upstream_url=sim_url, anthropic_url=sim_url.removesuffix("/v1"))
        models = tuple(replace(m, context_window=WINDOW) for m in settings.models)
        holder = ConfigHolder(replace(settings, models=models, path=""))
        context = build_context_service(holder)
        runner, port = await server.start(holder, context=context)
        runners.append(runner)
        return f"http://127.0.0.1:{port}", context, sim_runner.app[SIMULATOR], build_context_service(holder)

    yield make
    for runner in reversed(runners):
        await runner.cleanup()


def _messages_rewritten(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The last Messages body with an early user message rewritten in place (its tool results' or its text), then
    without it and the call before it."""
    messages = body["messages"]
    at = next(i for i, m in enumerate(messages) if i > 1 and m["role"] == "user")

    def rewritten(block: dict[str, Any]) -> dict[str, Any]:
        key = "content" if block.get("type") == "tool_result" else "text" if block.get("type") == "text" else None
        return {**block, key: "rewritten by the client"} if key else block

    edited = [*messages[:at], {**messages[at], "content": [rewritten(b) for b in messages[at]["content"]]}]
    edited += messages[at + 1 :]
    return [{**body, "messages": edited}, {**body, "messages": [*edited[: at - 1], *edited[at + 1 :]]}]


def _responses_rewritten(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The last Responses body with an early output (or user message) rewritten in place, then without the whole
    turn that made it (its reasoning, text and call)."""
    items = body["input"]
    at = next(
        i
        for i, item in enumerate(items)
        if i > 1 and (item.get("type") == "function_call_output" or item.get("role") == "user")
    )
    item = items[at]
    field = "output" if item.get("type") == "function_call_output" else "content"
    edited = [*items[:at], {**item, field: "rewritten by the client"}, *items[at + 1 :]]
    start = max(i for i in range(at) if edited[i].get("type") == "reasoning")
    return [{**body, "input": edited}, {**body, "input": [*edited[:start], *edited[at + 1 :]]}]


STYLES: dict[str, tuple[Dialect, str, Callable[..., Any], Callable[[dict[str, Any]], list[dict[str, Any]]]]] = {
    "claude-code": (MESSAGES, "messages", lambda t: messages_requests(t, "claude-sonnet-4-5"), _messages_rewritten),
    "messages-unmarked": (
        MESSAGES, "messages", lambda t: messages_requests(t, "claude-sonnet-4-5", "none"), _messages_rewritten
    ),
    "codex": (RESPONSES, "responses", lambda t: responses_requests(t, "gpt-5"), _responses_rewritten),
}  # fmt: skip


@pytest.mark.parametrize("style", list(STYLES))
@pytest.mark.parametrize("name", list_traces())
async def test_every_turn_sends_what_mapping_every_message_anew_sends(
    proxied: Callable[[], Any], monkeypatch: pytest.MonkeyPatch, name: str, style: str
) -> None:
    root, context, sim, reference = await proxied()
    monkeypatch.setattr(reference.conversations, "candidates", lambda scope: [])  # every body mapped anew
    dialect, path, requests, rewrite = STYLES[style]
    bodies = list(requests(load_trace(name)))
    headers = {"Authorization": f"Bearer {KEY}", "x-api-key": KEY, "anthropic-version": "2023-06-01"}
    edited = 0
    async with aiohttp.ClientSession() as http:
        for k, body in enumerate([*bodies, *rewrite(bodies[-1])]):
            raw = orjson.dumps(body)
            async with http.post(f"{root}/s/{style}/v1/{path}", data=raw, headers=headers) as response:
                assert response.status == 200, await response.text()
                answer, answered = await response.json(), response.headers
            turn = reference.prepare(
                path_session=style, headers={}, body=orjson.loads(raw), credential=KEY, dialect=dialect
            )
            expected = raw if turn.unchanged else orjson.dumps(turn.body)

            assert sim.requests[-1].raw == expected, f"turn {k + 1}: sent otherwise than mapped anew"
            for header, value in turn.headers.items():
                assert answered[header] == value, f"turn {k + 1}: {header}"
            turn.record_usage([answer])
            edited += not turn.unchanged
    assert context.conversations.held > 0  # the proxy kept the conversations it continued
    if not name.startswith("sweagent_text"):  # (its text mode needs its session rule's observation pattern)
        assert edited > 0
