"""The real Claude Code (2.1.332) headless, direct and through the proxy, against a scripted upstream on loopback.

The upstream (messages_upstream.py) plays the model with Claude Code's default model: signed
thinking, then Bash calls whose outputs are large, an Agent call whose subagent runs commands of
its own, then a final answer computed from the last output it got. Through a proxy whose window
is far smaller than the session, the run must end as it ends direct: same answer, same exit code,
every tool_use with its tool_result, every thinking block as the upstream issued it, every request
within the window, one session (the subagent one of its conversations), every turn billed, and
the whole run billed no more than direct.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.demo.simulator.blocks import blocks_of
from tests.agents.agent_cli import serve_local
from tests.agents.claude_cli import DEFAULT_MODEL, ClaudeRun, claude_rows, run_claude
from tests.agents.messages_upstream import FINAL_PREFIX, MAIN, SUB, Received, ScriptedMessages
from tests.conftest import MakeRig
from tests.harness import Rig
from tests.test_traces_http import reused_messages

# 420 lines of hex (~27k characters; Claude Code sends up to 30k of an output, a preview of a larger one).
HEX = "python3 -c \"import hashlib; print('\\n'.join(hashlib.sha256(b'{}%d' % i).hexdigest() for i in range(420)))\""
COMMANDS = (
    "seq 1 6000",
    HEX.format("alpha"),
    *(HEX.format(name) for name in ("beta", "gamma", "delta", "epsilon", "zeta")),
    "seq 5 5 60",
)
SUBAGENT_COMMANDS = (HEX.format("sub-one"), "seq 1 3000", "echo subagent done")
AGENT_AT = 3  # the main thread's fourth step starts the subagent
PROXY_WINDOW = 40_000
PROMPT = "Run the commands the model asks for, then report."


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[ScriptedMessages, str]]:
    scripted = ScriptedMessages(COMMANDS, SUBAGENT_COMMANDS, AGENT_AT)
    runner, root = await serve_local(scripted.app())
    yield scripted, root
    await runner.cleanup()


def pairs_broken(body: dict[str, Any]) -> list[str]:
    """tool_use ids without their tool_result and tool_results without their tool_use, in one request."""
    blocks = [b for m in body["messages"] for b in blocks_of(m.get("content")) if isinstance(b, dict)]
    uses = {b["id"] for b in blocks if b.get("type") == "tool_use"}
    results = {b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"}
    return sorted(uses ^ results)


def thinking_blocks(request: Received) -> list[bytes]:
    """The thinking blocks of a request, each found verbatim in its bytes."""
    blocks = [
        orjson.dumps(b)
        for m in request.body["messages"]
        for b in blocks_of(m.get("content"))
        if isinstance(b, dict) and b.get("type") == "thinking"
    ]
    assert all(block in request.raw for block in blocks)
    return blocks


async def run_both(
    upstream: tuple[ScriptedMessages, str], make_rig: MakeRig, tmp_path: Path
) -> tuple[ClaudeRun, list[Received], ClaudeRun, Rig, float]:
    """Direct, then through the proxy; and how many of the proxied run's messages the proxy did not parse again."""
    scripted, root = upstream
    direct = await run_claude(root, PROMPT, tmp_path / "home-direct", tmp_path / "work-direct")
    direct_requests = list(scripted.received)
    scripted.received.clear()
    scripted.sim.reset()  # the proxied run starts with a cold cache, as direct did
    rig = await make_rig(upstream_url=root + "/v1", engine=True)
    rig.holder.settings = replace(rig.holder.settings, models=claude_rows(PROXY_WINDOW))
    reused = await reused_messages(rig.root)
    proxied = await run_claude(rig.root, PROMPT, tmp_path / "home-proxied", tmp_path / "work-proxied")
    return direct, direct_requests, proxied, rig, await reused_messages(rig.root) - reused


async def test_claude_code_through_the_proxy_ends_as_direct_within_the_window_and_costs_no_more(
    upstream: tuple[ScriptedMessages, str], make_rig: MakeRig, tmp_path: Path
) -> None:
    scripted, _ = upstream
    direct, direct_requests, proxied, rig, reused = await run_both(upstream, make_rig, tmp_path)
    assert direct.returncode == 0, direct.stderr[-2000:]
    assert proxied.returncode == direct.returncode, (proxied.stderr[-2000:], proxied.result)
    assert direct.answer.startswith(FINAL_PREFIX)
    assert proxied.answer == direct.answer
    # Both asked the scripted model every step, the subagent's too; the proxied run needed no retry.
    for kind in (MAIN, SUB):
        steps = scripted.steps(kind) + 1
        assert [r.kind for r in direct_requests].count(kind) == steps
        assert [r.kind for r in scripted.received].count(kind) == steps
    assert {r.body["model"] for r in direct_requests} == {DEFAULT_MODEL}
    assert max(r.prompt_tokens for r in direct_requests) > 2 * PROXY_WINDOW  # direct outgrew the proxy's window
    # Every thinking block reaches the upstream byte for byte as direct, as the upstream issued it.
    direct_thinking = {orjson.loads(b)["thinking"]: b for r in direct_requests for b in thinking_blocks(r)}
    for request in scripted.received:
        assert not request.refused
        assert request.prompt_tokens <= PROXY_WINDOW, "the proxy sent more than its window"
        assert pairs_broken(request.body) == []
        for block in thinking_blocks(request):
            thought = orjson.loads(block)["thinking"]
            assert block == direct_thinking[thought] == scripted.issued[thought]
    # One session (Claude Code's session id), the subagent one of its conversations, every turn billed as sent.
    rows = await rig.context.sessions_json()
    assert [row["id"] for row in rows] == [scripted.received[-1].headers["X-Claude-Code-Session-Id"]]
    assert rows[0]["conversations"] == 2
    detail = await rig.context.session_json(rows[0]["id"])
    turns = detail["turn_details"] + [t for c in detail["conversations"][1:] for t in c["turn_details"]]
    assert sorted(t["prompt_tokens"] for t in turns) == sorted(r.prompt_tokens for r in scripted.received)
    # The whole run, subagent included, billed no more than direct (uncached 1, writes 1.25, reads 0.1).
    proxied_cost = sum(r.cost_units for r in scripted.received)
    direct_cost = sum(r.cost_units for r in direct_requests)
    assert proxied_cost <= direct_cost, (proxied_cost / direct_cost, [r.usage for r in scripted.received])
    for run in (direct, proxied):
        assert run.addresses and run.addresses <= {"127.0.0.1"}, run.addresses
    # Claude Code moves its breakpoint to the new last message: every message before the previous last one is
    # taken from the conversation's last body (proxy.service.body_memos), not parsed again.
    leading = 0
    for kind in (MAIN, SUB):
        sizes = [len(r.body["messages"]) for r in direct_requests if r.kind == kind]
        leading += sum(size - 1 for size in sizes[:-1])
    assert reused >= leading, (reused, leading)
