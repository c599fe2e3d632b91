"""Sessions that finish by idle teach the proxy how long its agent's sessions last (issue 27).

A real proxy (the engine service) in front of the simulator, the `openai` SDK as the agent: sessions of
known lengths go idle past `[policy] session_end_idle_s`, and `/sessions/{id}` of the next run of the same
agent shows the turns its history predicts to come and how many finished sessions that rests on. The
history survives a restart on SQLite, is shared by two instances on one Redis, and is never shared
between two credentials.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from proxy.context.survival import Lifetimes
from tests.conftest import MakeRig
from tests.redis_server import RedisServer

LENGTHS = (3, 4, 5, 6, 7)  # requests per finished session
POLICY = {"session_end_idle_s": 1.0}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]


def history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for i in range(turns):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {i}}}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"output {i}\n" * 20})
    return messages


async def run_session(root: str, session: str, requests: int, key: str = "sk-agent") -> None:
    """One run of the agent: `requests` requests, each the conversation so far."""
    full = history(requests)
    async with openai.AsyncOpenAI(base_url=f"{root}/s/{session}/v1", api_key=key, max_retries=0) as sdk:
        for n in range(requests):
            await sdk.chat.completions.create(model="gpt-4o", messages=full[: 2 + 2 * n], tools=TOOLS)  # type: ignore[arg-type]


async def report(root: str, session: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as client, client.get(f"{root}/sessions/{session}") as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def learned(root: str, session: str, count: int) -> dict[str, Any]:
    """The session's report once its agent's estimate rests on `count` finished sessions."""
    found: dict[str, Any] = {}
    for _ in range(100):
        found = await report(root, session)
        if found["history_sessions"] == count:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"no estimate on {count} finished sessions in 10 s: {found}")


async def test_finished_sessions_predict_the_turns_to_come(make_rig: MakeRig) -> None:
    rig = await make_rig(engine=True, policy=POLICY)
    for k, n in enumerate(LENGTHS):
        await run_session(rig.root, f"run-{k}", n)
    await learned(rig.root, "run-0", len(LENGTHS))
    await run_session(rig.root, "now", 2)  # still running: censored at 2
    body = await report(rig.root, "now")
    assert body["history_sessions"] == len(LENGTHS)
    expected = Lifetimes.of(LENGTHS, [2]).turns_to_come(2)
    assert body["turns_to_come"] == pytest.approx(expected, abs=0.01)
    assert body["turns_to_come"] == pytest.approx(3.0, abs=0.01)  # 3..7 all reach request 2: mean 5 - 2


async def test_with_no_history_nothing_is_predicted(make_rig: MakeRig) -> None:
    rig = await make_rig(engine=True, policy=POLICY)
    await run_session(rig.root, "first", 3)
    body = await report(rig.root, "first")
    assert body["history_sessions"] == 0 and body["turns_to_come"] is None


async def test_another_credential_never_reads_the_history(make_rig: MakeRig) -> None:
    rig = await make_rig(engine=True, policy=POLICY)
    for k, n in enumerate(LENGTHS):
        await run_session(rig.root, f"run-{k}", n)
    await learned(rig.root, "run-0", len(LENGTHS))
    await run_session(rig.root, "tenant-b", 2, key="sk-other-tenant")
    body = await report(rig.root, "tenant-b")
    assert body["history_sessions"] == 0 and body["turns_to_come"] is None


async def test_the_history_survives_a_restart(make_rig: MakeRig, tmp_path: Path) -> None:
    state = {"path": str(tmp_path / "state.sqlite")}
    rig = await make_rig(engine=True, policy=POLICY, state=state)
    for k, n in enumerate(LENGTHS):
        await run_session(rig.root, f"run-{k}", n)
    await learned(rig.root, "run-0", len(LENGTHS))
    await rig.close()
    again = await make_rig(engine=True, policy=POLICY, state=state)
    await run_session(again.root, "after", 2)
    body = await report(again.root, "after")
    assert body["history_sessions"] == len(LENGTHS)
    assert body["turns_to_come"] == pytest.approx(3.0, abs=0.01)


async def test_two_instances_share_the_history(make_rig: MakeRig, redis_server: RedisServer) -> None:
    state = {"redis_url": redis_server.url}
    first = await make_rig(engine=True, policy=POLICY, state=state)
    second = await make_rig(engine=True, policy=POLICY, state=state, upstream_url=first.sim_url)
    for k, n in enumerate(LENGTHS):
        await run_session(first.root, f"run-{k}", n)
    await learned(first.root, "run-0", len(LENGTHS))
    await run_session(second.root, "elsewhere", 2)
    body = await learned(second.root, "elsewhere", len(LENGTHS))
    assert body["turns_to_come"] == pytest.approx(3.0, abs=0.01)
