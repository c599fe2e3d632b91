"""Anthropic Messages through the proxy: the official `anthropic` SDK as the client, the simulator as Anthropic."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import anthropic
import pytest
from aiohttp import web

from proxy.config.loader import ConfigHolder, load_settings
from proxy.context.clearing import PLACEHOLDER
from proxy.demo.simulator import SIMULATOR, Simulator, SimulatorConfig, start_simulator
from proxy.demo.simulator.blocks import sign
from proxy.demo.traces import load_trace
from proxy.demo.traces_messages import messages_requests
from proxy.service.engine_service import build_context_service
from proxy.shell import server

SYSTEM = "You are a careful coding agent. " * 200  # over the 1,024-token minimum a cache entry needs


class Rig:
    def __init__(self, sim_runner: web.AppRunner, proxy_runner: web.AppRunner, port: int, context: Any) -> None:
        self.sim_runner, self.proxy_runner, self.port = sim_runner, proxy_runner, port
        self.context = context  # the proxy's ContextService (its session store keeps the clock)
        self.sim_url = f"http://127.0.0.1:{sim_runner.addresses[0][1]}"  # Anthropic's base URL: without /v1
        self.clients: list[anthropic.AsyncAnthropic] = []

    @property
    def sim(self) -> Simulator:
        return self.sim_runner.app[SIMULATOR]

    def client(self, session: str | None = None, *, direct: bool = False, **kwargs: Any) -> anthropic.AsyncAnthropic:
        """A client of the proxy (at `/s/{session}` if named), or (`direct`) of the simulator itself."""
        base = self.sim_url if direct else f"http://127.0.0.1:{self.port}" + (f"/s/{session}" if session else "")
        kwargs.setdefault("api_key", "sk-ant-client")
        client = anthropic.AsyncAnthropic(base_url=base, max_retries=0, **kwargs)
        self.clients.append(client)
        return client


@pytest.fixture(name="messages_rig")  # named: tests/test_messages_claude_code.py imports it under another name
async def messages_rig(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    runners: list[web.AppRunner] = []
    rigs: list[Rig] = []

    async def make(key_env: str = "", place_breakpoints: bool = True, first_edit_risk_turns: float = 0.0) -> Rig:
        sim_runner, sim_url = await start_simulator(SimulatorConfig(record_limit=50))
        runners.append(sim_runner)
        settings = load_settings(upstream_url=sim_url, anthropic_url=sim_url.removesuffix("/v1"))
        config = replace(settings.anthropic, api_key_env=key_env, place_breakpoints=place_breakpoints)
        policy = replace(settings.policy, first_edit_risk_turns=first_edit_risk_turns)
        settings = replace(settings, anthropic=config, path="", policy=policy)
        holder = ConfigHolder(settings)
        context = build_context_service(holder)
        proxy_runner, port = await server.start(holder, context=context)
        runners.append(proxy_runner)
        rigs.append(Rig(sim_runner, proxy_runner, port, context))
        return rigs[-1]

    yield make
    for rig in rigs:
        for client in rig.clients:
            await client.close()
    for runner in reversed(runners):
        await runner.cleanup()


def _conversation(turns: int, output: str) -> list[dict[str, Any]]:
    """A task, then `turns` tool calls each opened by a signed thinking block and answered by `output`."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test in utils.py."}]
    for k in range(turns):
        thought = f"turn {k}: read the next file"
        messages.append(
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": thought, "signature": sign(thought)},
                {"type": "tool_use", "id": f"toolu_{k:03d}", "name": "bash", "input": {"command": f"cat f{k}.py"}},
            ]}
        )  # fmt: skip
        result = {"type": "tool_result", "tool_use_id": f"toolu_{k:03d}", "content": f"{k}: {output}"}
        messages.append({"role": "user", "content": [result, {"type": "text", "text": f"note {k}"}]})
    return messages


async def test_create_answers_and_bills_the_cache_by_breakpoints(messages_rig: Any) -> None:
    rig = await messages_rig()
    client = rig.client("plain")
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": "hello"}]
    first = await client.messages.create(model="claude-sonnet-4-5", max_tokens=64, system=system, messages=messages)
    assert first.content[0].type == "text" and first.stop_reason == "end_turn"
    assert first.usage.cache_creation_input_tokens > 1024 and first.usage.cache_read_input_tokens == 0
    messages += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "go on"}]
    second = await client.messages.create(model="claude-sonnet-4-5", max_tokens=64, system=system, messages=messages)
    assert second.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens
    upstream = rig.sim.requests[-1]
    assert upstream.headers["Authorization"] == "Bearer sk-ant-client" and upstream.path == "/v1/messages"


async def test_stream_create_and_stream_helper_relay_the_event_sequence(messages_rig: Any) -> None:
    rig = await messages_rig()
    client = rig.client("streams")
    kwargs: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 2048, "system": SYSTEM}
    kwargs["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    messages = [{"role": "user", "content": "hello"}]
    events = [e async for e in await client.messages.create(messages=messages, stream=True, **kwargs)]
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert "content_block_delta" in kinds
    async with client.messages.stream(messages=messages, **kwargs) as stream:
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].signature == sign(final.content[0].thinking)
    assert rig.sim.totals.answered == 2


async def test_clearing_keeps_thinking_pairing_and_the_last_message(messages_rig: Any) -> None:
    """A conversation over the window: old tool results are cleared, thinking blocks go byte-identical."""
    rig = await messages_rig()
    client = rig.client("long")
    messages = _conversation(40, "x = 1\n" * 600)
    reply = await client.messages.create(
        model="claude-sim-32k", max_tokens=1024, messages=messages, thinking={"type": "enabled", "budget_tokens": 512}
    )
    assert reply.content[0].type == "thinking"
    sent = rig.sim.requests[-1].body["messages"]
    assert sent[-1]["content"][0]["content"] == messages[-1]["content"][0]["content"]
    blocks = [(m["role"], b) for m in sent if isinstance(m["content"], list) for b in m["content"]]
    results = [b for role, b in blocks if b.get("type") == "tool_result"]
    assert any(b["content"] == PLACEHOLDER for b in results)
    thinking = [b for role, b in blocks if b["type"] == "thinking"]
    assert thinking and all(b["signature"] == sign(b["thinking"]) for b in thinking)
    assert all(m["content"][0]["type"] == "thinking" for m in sent if m["role"] == "assistant")


async def test_a_trace_replayed_on_a_32k_model_is_answered_every_turn(messages_rig: Any) -> None:
    rig = await messages_rig()
    client = rig.client(f"trace-{time.monotonic_ns()}")
    turns = list(messages_requests(load_trace("sweagent_text_pydicom"), "claude-sim-32k"))
    for body in turns:
        await client.messages.create(**body)
    assert rig.sim.totals.answered == len(turns) and rig.sim.totals.refused == 0


async def test_a_client_without_breakpoints_gets_the_proxys(messages_rig: Any) -> None:
    rig = await messages_rig()
    client = rig.client("unmarked")
    messages = _conversation(3, "short output")
    await client.messages.create(model="claude-sonnet-4-5", max_tokens=64, system=SYSTEM, messages=messages)
    body = rig.sim.requests[-1].body
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    again = await client.messages.create(model="claude-sonnet-4-5", max_tokens=64, system=SYSTEM, messages=messages)
    assert again.usage.cache_read_input_tokens > 1024


async def test_the_proxys_key_goes_as_x_api_key_and_headers_pass(messages_rig: Any, monkeypatch) -> None:
    monkeypatch.setenv("CP_TEST_ANTHROPIC_KEY", "sk-ant-proxy")
    rig = await messages_rig(key_env="CP_TEST_ANTHROPIC_KEY")
    client = rig.client("keyed", default_headers={"anthropic-beta": "context-management-2025-06-27"})
    await client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    headers = rig.sim.requests[-1].headers
    assert headers["x-api-key"] == "sk-ant-proxy" and "authorization" not in headers
    assert headers["anthropic-beta"] == "context-management-2025-06-27"
    assert headers["anthropic-version"] == anthropic.AsyncAnthropic(api_key="k").default_headers["anthropic-version"]
    counted = await client.messages.count_tokens(
        model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hi"}]
    )
    assert counted.input_tokens > 0 and rig.sim.requests[-1].path == "/v1/messages/count_tokens"


async def test_upstream_refusals_are_relayed_in_anthropics_words(messages_rig: Any) -> None:
    rig = await messages_rig()
    client = rig.client("refused")
    bad = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "forged", "signature": "AAAA"}]},
        {"role": "user", "content": "again"},
    ]
    with pytest.raises(anthropic.BadRequestError) as refused:
        await client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=bad)
    assert refused.value.body["error"]["message"] == "messages.1.content.0: Invalid `signature` in `thinking` block"
    with pytest.raises(anthropic.BadRequestError) as invalid:
        await client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "robot"}])
    assert invalid.value.body["type"] == "error" and invalid.value.body["error"]["type"] == "invalid_request_error"


async def test_prompt_too_long_is_refitted_once(messages_rig: Any) -> None:
    """Claude counts far more than our estimate: the upstream refuses, the proxy re-fits to its count and retries."""
    rig = await messages_rig()
    rig.sim.config.claude_token_ratio = 1.7  # far over the start margin (1.2): the first try overflows
    client = rig.client("refit")
    messages = _conversation(290, "value computed ok; " * 8)  # ~25.8k tokens by our margined count, ~33.5k by Claude's
    reply = await client.messages.create(model="claude-sim-32k", max_tokens=1024, messages=messages)
    assert reply.stop_reason == "end_turn"
    assert rig.sim.totals.refused == 1 and rig.sim.totals.answered == 1
    assert len(rig.sim.requests[-1].body["messages"]) < len(messages)


async def test_session_id_from_claude_code_header(messages_rig: Any) -> None:
    rig = await messages_rig()
    client = rig.client(default_headers={"X-Claude-Code-Session-Id": "cc-abc"})
    await client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{rig.port}/sessions") as response:
        rows = await response.json()
    assert any(row["id"] == "cc-abc" for row in rows)


async def test_a_cut_error_result_goes_without_the_engines_error_prefix(messages_rig: Any) -> None:
    """The engine reads an is_error result as "Error: ..."; that word is its own, never the upstream's to see."""
    rig = await messages_rig()
    client = rig.client("errors")
    messages = _conversation(10, "x = 1\n" * 800)
    failed = messages[18]["content"][0]  # among the last 6 messages: never cleared, but cut when oversized
    failed["is_error"] = True
    failed["content"] = "".join(f"  File app{n}.py, line {n}, in run\n" for n in range(1500))
    await client.messages.create(model="claude-sim-32k", max_tokens=1024, messages=messages)
    sent = rig.sim.requests[-1].body["messages"]
    results = {b["tool_use_id"]: b for m in sent if isinstance(m["content"], list) for b in m["content"]
               if b["type"] == "tool_result"}  # fmt: skip
    cut = results[failed["tool_use_id"]]
    assert cut["is_error"] is True and cut["content"] != failed["content"]
    assert cut["content"].startswith(failed["content"][:200])
