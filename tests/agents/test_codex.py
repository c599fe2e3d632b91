"""The real Codex CLI (0.171.0) headless, direct and through the proxy, against a scripted upstream on loopback.

The upstream (responses_upstream.py) plays the model: it asks Codex to run real shell commands
with large outputs (the same `seq` twice among them), then answers from the last output it got.
Through a proxy whose window is far smaller than the session, the run must end as it ends
direct: same answer, same exit code, every call with its output, every reasoning item as the
upstream issued it, every request within the window, one session, every turn billed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.context.policy import ModelInfo
from tests.agents.agent_cli import serve_local
from tests.agents.codex_cli import CodexRun, run_codex
from tests.agents.responses_upstream import FINAL_PREFIX, Received, ScriptedResponses
from tests.conftest import MakeRig
from tests.test_traces_http import reused_messages

MODEL = "gpt-5.1-codex"  # the model Codex asks for; the proxy's table gets an entry with the test's window
# 600 lines of hex (~25k tokens; Codex sends about 10k tokens of it, its own cap per output).
HEX = "python3 -c \"import hashlib; print('\\n'.join(hashlib.sha256(b'{}%d' % i).hexdigest() for i in range(600)))\""
COMMANDS = (
    "seq 1 20000",
    HEX.format("alpha"),
    "seq 1 20000",  # the same output again: dedup sees through Codex's chunk id and wall time
    *(HEX.format(name) for name in ("beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")),
    "seq 5 5 60",
)
PROXY_WINDOW = 32000
PROMPT = "Run the commands the model asks for, then report."


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[ScriptedResponses, str]]:
    scripted = ScriptedResponses(COMMANDS)
    runner, root = await serve_local(scripted.app())
    yield scripted, root + "/v1"
    await runner.cleanup()


def pairs_broken(body: dict[str, Any]) -> list[str]:
    """Calls without their output and outputs without their call, in one request's input."""
    items = [i for i in body.get("input", []) if isinstance(i, dict)]
    calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
    outputs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    return sorted(calls ^ outputs)


def reasoning_items(request: Received) -> list[bytes]:
    """The reasoning items of a request as they sit in its bytes (each one's JSON found verbatim in the body)."""
    items = [orjson.dumps(i) for i in request.body.get("input", []) if i.get("type") == "reasoning"]
    assert all(item in request.raw for item in items)
    return items


async def run_direct_and_proxied(
    upstream: tuple[ScriptedResponses, str], make_rig: MakeRig, tmp_path: Path
) -> tuple[CodexRun, CodexRun, Any]:
    scripted, url = upstream
    started = time.monotonic()
    direct = await run_codex(url, PROMPT, tmp_path / "home-direct", tmp_path / "work-direct")
    direct_requests = list(scripted.received)
    scripted.received.clear()
    rig = await make_rig(upstream_url=url, engine=True)
    rig.holder.settings = replace(rig.holder.settings, models=(ModelInfo(pattern=MODEL, context_window=PROXY_WINDOW),))
    reused = await reused_messages(rig.root)
    proxied = await run_codex(rig.base_url, PROMPT, tmp_path / "home-proxied", tmp_path / "work-proxied")
    assert time.monotonic() - started < 60
    return direct, proxied, (direct_requests, rig, await reused_messages(rig.root) - reused)


async def test_codex_through_the_proxy_ends_as_direct_within_the_window_on_loopback_alone(
    upstream: tuple[ScriptedResponses, str], make_rig: MakeRig, tmp_path: Path
) -> None:
    scripted, _ = upstream
    direct, proxied, (direct_requests, rig, reused) = await run_direct_and_proxied(upstream, make_rig, tmp_path)
    assert direct.returncode == 0, direct.stderr[-2000:]
    assert proxied.returncode == direct.returncode, proxied.stderr[-2000:]
    assert direct.last_message.startswith(FINAL_PREFIX)
    assert proxied.last_message == direct.last_message
    # The scripted model was asked every step by both; the proxied run needed no retry of its own.
    assert len(direct_requests) == len(scripted.received) == len(COMMANDS) + 1
    assert max(r.prompt_tokens for r in direct_requests) > 2 * PROXY_WINDOW  # direct outgrew the proxy's window
    # Every reasoning item reaches the upstream byte for byte as Codex sends it direct, as the upstream issued it.
    direct_reasoning = {orjson.loads(item)["id"]: item for r in direct_requests for item in reasoning_items(r)}
    for request in scripted.received:
        assert request.prompt_tokens <= PROXY_WINDOW, "the proxy sent more than its window"
        assert pairs_broken(request.body) == []
        for item in reasoning_items(request):
            found = orjson.loads(item)
            assert item == direct_reasoning[found["id"]]
            assert {k: v for k, v in found.items() if k != "content"} == scripted.issued[found["id"]]
    # One session, named by Codex's session-id header, every turn with what the upstream billed.
    rows = await rig.context.sessions_json()
    assert len(rows) == 1
    assert rows[0]["id"] == scripted.received[-1].headers["session-id"]
    turns = (await rig.context.session_json(rows[0]["id"]))["turn_details"]
    assert len(turns) == len(scripted.received)
    assert [t["prompt_tokens"] for t in turns] == [r.prompt_tokens for r in scripted.received]

    # Nothing but loopback, and one WebSocket attempt per run, direct and proxied: the 426 came through.
    for run in (direct, proxied):
        assert run.addresses and run.addresses <= {"127.0.0.1"}, run.addresses
    assert scripted.upgrades == 2
    # Codex sends its whole `input` again every turn: every item of the turn before is taken from the last body
    # (proxy.service.body_memos), not parsed again.
    assert reused >= sum(len(r.body["input"]) for r in direct_requests[:-1]), reused
