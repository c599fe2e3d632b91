"""Session regexes from the config run in time linear in the text, and a pattern that could not is refused at load."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from proxy.config.loader import DEFAULT_CONFIG, ConfigError, ConfigHolder, load_settings
from proxy.config.settings import UpstreamConfig
from proxy.demo.simulator import start_simulator
from proxy.service.engine_service import build_context_service
from tests.harness import serve_proxy

# Old `re` needed ~27 s for 640 KB of this against the shipped pattern and grew with the square of
# the size: 2 MB would take minutes. Linear, it is milliseconds; the bounds below only catch a hang.
HOSTILE_TEXT = "(Current directory: " * 100_000
BOUND_S = 60


async def test_a_hostile_message_in_a_text_mode_session_neither_hangs_the_turn_nor_healthz() -> None:
    sim_runner, sim_url = await start_simulator()
    settings = load_settings(upstream_url=sim_url)  # the shipped config, with sessions/swe-agent-text.toml
    holder = ConfigHolder(replace(settings, upstream=replace(UpstreamConfig(), base_url=sim_url)))
    runner, port = await serve_proxy(holder, build_context_service(holder))
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": "Fix the bug."},
            {"role": "assistant", "content": "ls"},
            {"role": "user", "content": HOSTILE_TEXT},
            {"role": "assistant", "content": "cat x"},
            {"role": "user", "content": "(Current directory: /repo)\nbash-$"},
        ],
    }
    root = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=BOUND_S)) as client:
            chat = asyncio.create_task(client.post(f"{root}/s/swe-agent-text-7/v1/chat/completions", json=body))
            await asyncio.sleep(0.2)  # the turn is being prepared
            async with client.get(f"{root}/healthz", timeout=aiohttp.ClientTimeout(total=10)) as health:
                assert health.status == 200
            async with await chat as response:
                assert response.status == 200, await response.text()
    finally:
        await runner.cleanup()
        await sim_runner.cleanup()


def test_the_shipped_pattern_still_tells_observations_from_the_task() -> None:
    from proxy.context.patterns import compile_patterns

    policy, _ = load_settings().policy_for("swe-agent-text-1")
    (pattern,) = compile_patterns(policy.clear_tool_outputs.observation_patterns)
    prompt = "\n(Open file: n/a)\n(Current directory: /repo)\nbash-$"
    assert pattern.search("total 4\nsetup.py" + prompt)
    assert not pattern.search("We're currently solving the following issue." + prompt)
    assert not pattern.search("total 4\nsetup.py")


@pytest.mark.parametrize(
    "pattern", [r"^(?!Traceback)Error", r"(a)\1", r"done\Z"], ids=["look-ahead", "backreference", "python-Z"]
)
def test_a_pattern_the_linear_engine_cannot_run_is_refused_at_load_naming_file_and_pattern(
    tmp_path: Path, pattern: str
) -> None:
    shutil.copy(DEFAULT_CONFIG, tmp_path / "proxy.toml")
    (tmp_path / "sessions").mkdir()
    rule = tmp_path / "sessions" / "agent.toml"
    rule.write_text(f"match = ['a-*']\n[policy.clear_tool_outputs]\nerror_patterns = ['''{pattern}''']\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(tmp_path / "proxy.toml")
    assert str(rule) in str(refused.value) and repr(pattern) in str(refused.value)
