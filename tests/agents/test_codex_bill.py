"""The real Codex CLI (0.171.0), direct and through the proxy: what the proxy says direct would have billed.

Codex sends a signed reasoning item with every call; the proxy cannot read its blob and estimates the tokens the
upstream bills for it. The scripted upstream (responses_upstream.py) bills the blob's own characters, several
times that estimate. A single learned ratio, fitted on requests whose edits had left mostly reasoning, scaled the
client's whole request by the blob's error: the proxy then counted Codex's last request at 1.3x what the upstream
billed it direct, reported savings several times what they were, and priced its edits by them. Through a 200k
window, with cached input at a tenth of the price, the session's count of the client's request and its direct bill
must be what the direct run was billed, within a few percent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from proxy.context.policy import ModelInfo
from tests.agents.agent_cli import serve_local
from tests.agents.codex_cli import run_codex
from tests.agents.responses_upstream import FINAL_PREFIX, ScriptedResponses
from tests.conftest import MakeRig

MODEL = "gpt-5.1-codex"
INPUT, CACHED = 1.25, 0.125  # $ per million tokens (gpt-5)
HEX = "python3 -c \"import hashlib; print('\\n'.join(hashlib.sha256(b'{}%d' % i).hexdigest() for i in range({})))\""
# 44 commands, outputs from a few lines to Codex's own cap: a session long enough that clearing pays at 200k.
COMMANDS = tuple(
    command
    for k in range(11)
    for command in (
        HEX.format(f"file{k}", 40 + 25 * (k % 4)),
        f"seq {k} 7 {3000 + 400 * k}",
        "ls -la /usr/lib | head -120",
        "seq 1 20000" if k % 3 == 0 else f"cat /etc/os-release; echo step {k}",
    )
)
PROMPT = "Run the commands the model asks for, then report."


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[ScriptedResponses, str]]:
    scripted = ScriptedResponses(COMMANDS, window=200_000)
    runner, root = await serve_local(scripted.app())
    yield scripted, root + "/v1"
    await runner.cleanup()


def cost(prompt: int, cached: int) -> float:
    return ((prompt - cached) * INPUT + cached * CACHED) / 1e6


async def test_codex_through_the_proxy_is_counted_and_billed_as_direct_was(
    upstream: tuple[ScriptedResponses, str], make_rig: MakeRig, tmp_path: Path
) -> None:
    scripted, url = upstream
    direct = await run_codex(url, PROMPT, tmp_path / "home-direct", tmp_path / "work-direct")
    assert direct.returncode == 0 and direct.last_message.startswith(FINAL_PREFIX), direct.stderr[-2000:]
    direct_requests = list(scripted.received)
    scripted.received.clear()
    rig = await make_rig(upstream_url=url, engine=True)
    row = ModelInfo(pattern=MODEL, context_window=200_000, input_per_mtok=INPUT, cached_input_per_mtok=CACHED)
    rig.holder.settings = replace(rig.holder.settings, models=(replace(row, cache_ttl_s=3600),))
    proxied = await run_codex(rig.base_url, PROMPT, tmp_path / "home-proxied", tmp_path / "work-proxied")
    assert proxied.last_message == direct.last_message, proxied.stderr[-2000:]
    assert len(scripted.received) == len(direct_requests) == len(COMMANDS) + 1

    (row_json,) = await rig.context.sessions_json()
    report = await rig.context.session_json(row_json["id"])
    assert report is not None and report["epochs"] > 0  # the proxy edited: its requests' mix of text and blobs moved
    counted, billed = report["tokens_before"], direct_requests[-1].prompt_tokens  # the same request from Codex
    assert abs(counted - billed) <= 0.06 * billed, (counted, billed)
    direct_cost = sum(cost(r.prompt_tokens, r.cached_tokens) for r in direct_requests)
    assert abs(report["direct_cost_usd"] - direct_cost) <= 0.06 * direct_cost, (report["direct_cost_usd"], direct_cost)
    proxied_cost = sum(cost(r.prompt_tokens, r.cached_tokens) for r in scripted.received)
    assert report["cost_usd"] == pytest.approx(proxied_cost, rel=0.01)
    assert proxied_cost < direct_cost
