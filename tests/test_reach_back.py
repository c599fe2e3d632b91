"""An agent whose finished sessions never reached past the newest tool output is trusted to work from it (issue 27).

A real proxy (the engine service) in front of the simulator, the `openai` SDK as the agent. Each run quotes, in
its messages, names from the tool outputs: one agent only from the newest output, another from outputs two calls
back. Once their sessions have gone idle past `[policy] session_end_idle_s`, `/sessions/{id}` of a new run shows
how far back the agent's history reached, and the same conversation that went upstream whole before the history
has its older outputs cleared for the agent that never reached back, and not for the one that did. What the
history holds survives a restart on SQLite (a state file from before it included) and is shared on Redis.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import openai
import orjson

from proxy.context.clearing import PLACEHOLDER
from tests.conftest import MakeRig
from tests.harness import Rig
from tests.redis_server import RedisServer
from tests.test_session_ends import POLICY, TOOLS, learned, report

STEPS = 6  # requests per run
LINES = 20  # lines per tool output: ~270 tokens each, kept whole by the default rule


def conversation(reach_back: int, system: str) -> list[dict[str, Any]]:
    """A run whose k-th agent message quotes three names of the output `reach_back` calls before its newest."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for i in range(STEPS):
        source = i - reach_back
        quoted = ", ".join(f"check_{source}_{k}" for k in range(3)) if source >= 0 else "nothing yet"
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {i}}}'}}
        messages.append({"role": "assistant", "content": f"Looking at {quoted}.", "tool_calls": [call]})
        body = "".join(f"check_{i}_{k}: value {1000 + 37 * k + i} of the scan\n" for k in range(LINES))
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": body})
    return messages


async def run(rig: Rig, session: str, messages: list[dict[str, Any]], upstream: Rig | None = None) -> list[str]:
    """One run of the agent, request by request; the tool outputs of its last request as they went upstream
    (to the simulator of `upstream`, else of `rig`)."""
    async with openai.AsyncOpenAI(base_url=f"{rig.root}/s/{session}/v1", api_key="sk-agent", max_retries=0) as sdk:
        for n in range(1, STEPS + 1):
            await sdk.chat.completions.create(model="gpt-4o", messages=messages[: 2 + 2 * n], tools=TOOLS)  # type: ignore[arg-type]
    sent = orjson.loads((upstream or rig).sim.requests[-1].raw)["messages"]
    return [m["content"] for m in sent if m["role"] == "tool"]


async def test_an_agent_that_never_reaches_back_has_its_older_outputs_cleared(make_rig: MakeRig) -> None:
    rig = await make_rig(engine=True, policy=POLICY)
    newest_only = conversation(1, "You are a careful coding agent that works from what it just saw.")
    reaching = conversation(3, "You are a careful coding agent that looks back.")
    before = await run(rig, "first-look", newest_only)  # no history yet: today's rule, every output whole
    assert PLACEHOLDER not in before
    first = await report(rig.root, "first-look")
    assert first["epochs"] == 0 and first["trusts_newest_output"] is False and first["history_reach_back"] is None
    assert PLACEHOLDER not in await run(rig, "first-back", reaching)
    for k in range(3):
        await run(rig, f"look-{k}", newest_only)
        await run(rig, f"back-{k}", reaching)
    await learned(rig.root, "first-look", 4)
    await learned(rig.root, "first-back", 4)

    looking = await run(rig, "now-look", newest_only)
    look = await report(rig.root, "now-look")
    assert look["history_reach_back"] == 0.0 and look["trusts_newest_output"] is True
    assert look["epochs"] >= 1 and look["tokens_after"] < look["tokens_before"] - 1000
    assert looking[-1] == newest_only[-1]["content"]  # the newest output whole, every older one cleared
    assert all(content == PLACEHOLDER for content in looking[:-1])

    reaching_sent = await run(rig, "now-back", reaching)
    back = await report(rig.root, "now-back")
    assert back["history_reach_back"] > 0.5 and back["trusts_newest_output"] is False
    assert back["epochs"] == 0 and reaching_sent == before  # as before the history: every output whole


async def test_the_reach_survives_a_restart_and_an_older_state_file(make_rig: MakeRig, tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    with sqlite3.connect(path) as db:  # a state file from before the reach columns, one finished session in it
        db.execute(
            "CREATE TABLE lifetimes (agent TEXT NOT NULL, session TEXT NOT NULL, length INTEGER NOT NULL, "
            "ended REAL NOT NULL, PRIMARY KEY (agent, session))"
        )
        db.execute("INSERT INTO lifetimes VALUES ('elsewhere', 'old-run', 5, 1.0)")
    state = {"path": str(path)}
    rig = await make_rig(engine=True, policy=POLICY, state=state)
    newest_only = conversation(1, "You are a careful coding agent that works from what it just saw.")
    for k in range(4):
        await run(rig, f"look-{k}", newest_only)
    await learned(rig.root, "look-0", 4)
    await rig.close()
    again = await make_rig(engine=True, policy=POLICY, state=state)
    looking = await run(again, "after", newest_only)
    body = await report(again.root, "after")
    assert body["history_sessions"] == 4 and body["trusts_newest_output"] is True
    assert looking[0] == PLACEHOLDER and looking[-1] == newest_only[-1]["content"]


async def test_two_instances_share_the_reach(make_rig: MakeRig, redis_server: RedisServer) -> None:
    state = {"redis_url": redis_server.url}
    first = await make_rig(engine=True, policy=POLICY, state=state)
    second = await make_rig(engine=True, policy=POLICY, state=state, upstream_url=first.sim_url)
    reaching = conversation(3, "You are a careful coding agent that looks back.")
    for k in range(4):
        await run(first, f"back-{k}", reaching)
    await learned(first.root, "back-0", 4)
    assert PLACEHOLDER not in await run(second, "elsewhere", reaching, upstream=first)
    body = await learned(second.root, "elsewhere", 4)
    assert body["history_reach_back"] > 0.5 and body["trusts_newest_output"] is False
