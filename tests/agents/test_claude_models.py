"""Every model the real Claude Code (2.1.332) offers, direct and through the proxy, a short run each.

What each `--model` sends was read off the binary's model catalog and its requests to a scripted
upstream: the aliases resolve to `claude-opus-5-5` (default, `opus`, `opus[1m]`, `best`, and the
legacy `claude-opus-4-1`), `claude-sonnet-5-5` (`sonnet`, `sonnet[1m]`, `opusplan` in print mode),
`claude-haiku-5-5` (`haiku`) and `claude-fable-5-2` (`fable`, `fable[1m]`); a `[1m]` suffix never
reaches the wire. What differs between the models is what a proxy has to carry: the betas
(`per-turn-control`, `mid-conversation-tool-changes`, and `context-1m-2025-08-07` for the 4.6 models'
`[1m]`), `role: "system"` messages mid-conversation (and, for Haiku 5.5, after the newest tool
results), `output_config.effort`, adaptive thinking or Haiku 4.5's `budget_tokens`. One model per
request shape runs here (test_claude_code runs the default), through a proxy whose Claude window
is far smaller than the run: the same answer and exit code as direct, the same model, betas and
fields upstream, every pair and thinking block intact, every request within the window the proxy
used — and the `context-1m` beta gets the 1M window whatever the table says.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from proxy.config.loader import packaged_models
from proxy.config.settings import Settings
from tests.agents.agent_cli import serve_local
from tests.agents.claude_cli import ClaudeRun, claude_rows, run_claude
from tests.agents.messages_upstream import FINAL_PREFIX, Received, ScriptedMessages
from tests.agents.test_claude_code import HEX, PROMPT, pairs_broken, thinking_blocks
from tests.conftest import MakeRig

COMMANDS = (HEX.format("first"), HEX.format("second"))  # ~13k tokens each: the third request outgrows the window
LEAN, FULL = 40_000, 46_000  # the proxy's Claude window: ~12.5k of system and tools for some models, ~21.5k for others
ONE_MILLION = 1_000_000
# `--model` -> the model id it sends and the proxy's window for the run: one per request shape (betas, roles,
# thinking and effort fields).
MODELS = {
    "sonnet": ("claude-sonnet-5-5", LEAN),
    "haiku": ("claude-haiku-5-5", LEAN),  # its system reminder comes after the newest tool results
    "fable[1m]": ("claude-fable-5-2", LEAN),
    "claude-opus-4-8": ("claude-opus-4-8", LEAN),  # as claude-opus-5: mid-conversation-tool-changes, effort high
    "claude-sonnet-5": ("claude-sonnet-5", FULL),
    "claude-opus-4-7": ("claude-opus-4-7", FULL),  # no system messages mid-conversation, effort xhigh
    "claude-sonnet-4-6[1m]": ("claude-sonnet-4-6", FULL),  # the context-1m beta
    "claude-haiku-4-5": ("claude-haiku-4-5", FULL),  # thinking with budget_tokens, no effort
}
# Each model Claude Code 2.1.332 offers, and its window in that binary's catalog (native 1M from the 5 family,
# Opus 4.7 and 4.8; the 4.6 models reach 1M with the context-1m beta, Claude Code's `[1m]`).
CATALOG_WINDOWS = {
    "claude-opus-5-5": ONE_MILLION, "claude-opus-5": ONE_MILLION, "claude-opus-4-8": ONE_MILLION,
    "claude-opus-4-7": ONE_MILLION, "claude-opus-4-6": 200_000, "claude-sonnet-5-5": ONE_MILLION,
    "claude-sonnet-5": ONE_MILLION, "claude-sonnet-4-6": 200_000, "claude-haiku-5-5": ONE_MILLION,
    "claude-haiku-4-5": 200_000, "claude-fable-5-2": ONE_MILLION,
}  # fmt: skip


def test_the_packaged_table_gives_every_offered_model_its_catalog_window() -> None:
    settings = Settings(models=packaged_models())
    assert {model: settings.model(model).context_window for model in CATALOG_WINDOWS} == CATALOG_WINDOWS


def shape(request: Received) -> dict[str, Any]:
    """What a request carries beside its conversation: model, betas, the fields Claude Code sets per model."""
    body = request.body
    fields = {k: v for k, v in body.items() if k not in ("messages", "system", "tools", "metadata")}
    return {"beta": request.headers.get("anthropic-beta"), **fields, "tools": [t.get("name") for t in body["tools"]]}


async def run_at(base_url: str, model: str, home: Path) -> ClaudeRun:
    return await run_claude(base_url, PROMPT, home / "home", home / "work", model=model)


@pytest.mark.parametrize("model", list(MODELS))
async def test_each_model_claude_code_offers_ends_through_the_proxy_as_direct(
    model: str, make_rig: MakeRig, tmp_path: Path
) -> None:
    model_id, proxy_window = MODELS[model]
    direct_up, proxied_up = ScriptedMessages(COMMANDS), ScriptedMessages(COMMANDS)
    (direct_runner, direct_root), (proxied_runner, proxied_root) = (
        await serve_local(direct_up.app()),
        await serve_local(proxied_up.app()),
    )
    try:
        rig = await make_rig(upstream_url=proxied_root + "/v1", engine=True)
        rig.holder.settings = replace(rig.holder.settings, models=claude_rows(proxy_window))
        direct, proxied = await asyncio.gather(
            run_at(direct_root, model, tmp_path / "direct"),
            run_at(rig.root, model, tmp_path / "proxied"),
        )
    finally:
        await direct_runner.cleanup()
        await proxied_runner.cleanup()
    assert direct.returncode == 0, direct.stderr[-2000:]
    assert (proxied.returncode, proxied.answer) == (direct.returncode, direct.answer), proxied.stderr[-2000:]
    assert direct.answer.startswith(FINAL_PREFIX)
    assert {r.body["model"] for r in direct_up.received} == {model_id}
    # Same steps asked once each, each request carrying what direct's carried (betas, effort, thinking, tools).
    assert len(proxied_up.received) == len(direct_up.received) == len(COMMANDS) + 1
    assert [shape(r) for r in proxied_up.received] == [shape(r) for r in direct_up.received]
    assert [[m["role"] for m in r.body["messages"]] for r in proxied_up.received][:2] == [
        [m["role"] for m in r.body["messages"]] for r in direct_up.received
    ][:2]  # the requests the window left alone
    one_million = "context-1m-" in str(direct_up.received[0].headers.get("anthropic-beta"))
    window = ONE_MILLION if one_million else proxy_window
    assert max(r.prompt_tokens for r in direct_up.received) > proxy_window  # direct outgrew the proxy's Claude rows
    for request in proxied_up.received:
        assert not request.refused
        assert request.prompt_tokens <= window
        assert pairs_broken(request.body) == []
        assert all(block in request.raw for block in thinking_blocks(request))
    rows = await rig.context.sessions_json()
    assert len(rows) == 1
    detail = await rig.context.session_json(rows[0]["id"])
    assert {t["window"] for t in detail["turn_details"]} == {window}
    if one_million:  # nothing to edit in a 1M window: every turn went upstream as Claude Code sent it
        assert all(t["tokens_after"] == t["tokens_before"] and not t["epoch"] for t in detail["turn_details"])
