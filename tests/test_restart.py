"""A restart mid-conversation, with `state.path` set, changes nothing the upstream sees.

Two runs of the same agent conversation: a control that never stops, and one whose server is
stopped while a streamed turn is in flight (the store is abandoned, not closed, as in a crash)
and started again on the same SQLite file. From the interrupted turn on, every upstream body
of the second run must equal the control's, byte for byte in its messages.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.config.loader import ConfigHolder
from proxy.context.policy import ModelInfo
from proxy.demo.simulator import SimulatorConfig, start_simulator
from tests.harness import make_settings, serve_proxy, settle

MODEL = "sim-8k"
TURNS = 14
STOP_AT = 9  # the turn in flight when the server stops
POLICY = {
    "reserve_output_tokens": 500,
    "high_water": 0.8,
    "low_water": 0.5,
    "clear_tool_outputs": {"keep_tokens": 800, "keep_under": 50, "clear_at_least": 200},
}


def agent_history(turns: int) -> list[dict[str, Any]]:
    """A coding agent's run: each turn one tool call and a ~300-token output, so clearing has work to do."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "The date parser test fails; find the bug and fix it."},
    ]
    for i in range(turns):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "read_file", "arguments": f'{{"n": {i}}}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        lines = [f"{i}:{j} def parse_{j}(value): return value.split('-')[{j % 3}]  # step {i * j}" for j in range(25)]
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "\n".join(lines)})
    return messages


def turn_messages(history: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    return history[: 2 + 2 * n]


async def start_proxy(sim_url: str, state_path: str) -> tuple[Any, int, Any]:
    from proxy.service.engine_service import build_context_service

    settings = make_settings(sim_url, state={"path": state_path}, policy=POLICY)
    model = ModelInfo(pattern="sim-*", context_window=8000, input_per_mtok=1.0, cached_input_per_mtok=0.1)
    holder = ConfigHolder(replace(settings, models=(model,)))
    context = build_context_service(holder)
    runner, port = await serve_proxy(holder, context)
    return runner, port, context


async def ask(port: int, n: int, history: list, *, delay_ms: int = 0) -> None:
    """Turn `n`, streamed; it must come back whole."""
    body = {"model": MODEL, "messages": turn_messages(history, n), "stream": True, "max_tokens": 300}
    headers = {"X-Session-Id": "agent-restart", "X-Sim-Delay-Ms": str(delay_ms)}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with aiohttp.ClientSession() as client, client.post(url, json=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        data = await response.read()
    assert data.rstrip().endswith(b"[DONE]")


def upstream_bodies(sim_runner: Any) -> list[list[dict[str, Any]]]:
    from proxy.demo.simulator import SIMULATOR

    return [r.body["messages"] for r in sim_runner.app[SIMULATOR].requests if r.path.endswith("/chat/completions")]


async def test_a_restart_mid_turn_replays_the_same_decisions(tmp_path: Path) -> None:
    history = agent_history(TURNS)

    control_sim, control_url = await start_simulator(SimulatorConfig())
    runner, port, context = await start_proxy(control_url, str(tmp_path / "control.sqlite"))
    try:
        for n in range(1, TURNS + 1):
            await ask(port, n, history)
    finally:
        await runner.cleanup()
        context.store.close()
    control = upstream_bodies(control_sim)
    await control_sim.cleanup()
    assert any(m != turn_messages(history, n + 1) for n, m in enumerate(control)), "no decision to replay"

    sim, sim_url = await start_simulator(SimulatorConfig(chunks=200))
    state_path = str(tmp_path / "state.sqlite")
    try:
        runner, port, context = await start_proxy(sim_url, state_path)
        for n in range(1, STOP_AT):
            await ask(port, n, history)
        in_flight = asyncio.create_task(ask(port, STOP_AT, history, delay_ms=20))
        assert await settle(lambda: len(upstream_bodies(sim)) == STOP_AT, timeout=5)
        await runner.cleanup()  # stop mid-turn; the store is abandoned without close(), like a crash
        with pytest.raises((aiohttp.ClientError, AssertionError)):
            await in_flight

        runner, port, context = await start_proxy(sim_url, state_path)
        try:
            for n in range(STOP_AT, TURNS + 1):  # the client retries the interrupted turn, then goes on
                await ask(port, n, history)
        finally:
            await runner.cleanup()
            context.store.close()
        restarted = upstream_bodies(sim)
    finally:
        await sim.cleanup()

    assert restarted[: STOP_AT - 1] == control[: STOP_AT - 1]
    # restarted[STOP_AT - 1] is the interrupted request; its retry follows it.
    assert restarted[STOP_AT - 1] == control[STOP_AT - 1]
    for n in range(STOP_AT, TURNS + 1):
        assert restarted[n] == control[n - 1], f"turn {n} differs after the restart"
