"""Above `high_water` but within the window, the request goes as the client wrote it unless truncating now pays.

A real proxy (its config from a TOML file) in front of the simulator, the official SDK as the client. At a cheap
cached price (d = 0.1) a truncation rewrites the whole cached conversation after the task, which a session that ends
before outgrowing the window would never win back: the proxy waits until the request no longer fits. Where cached
input costs what fresh input does (d = 1), truncating at once saves on every turn after, so it truncates at
`high_water` as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.config.loader import ConfigHolder, load_settings
from proxy.demo.simulator import SIMULATOR, SimulatorConfig, start_simulator
from proxy.service.engine_service import build_context_service
from tests.harness import Rig, serve_proxy

MODEL = "sim-8k"
USABLE = 8000 - 500  # the window less `reserve_output_tokens`
CONFIG = """
[upstream]
base_url = "{url}"
connect_timeout_s = 2
read_timeout_s = 10

[models."sim-*"]
context_window = 8000
encoding = "o200k_base"
input_per_mtok = 1.0
cached_input_per_mtok = {cached}
output_per_mtok = 4.0

[policy]
reserve_output_tokens = 500
high_water = 0.9
low_water = 0.6
"""
PHRASE = "the parser splits on dashes but the locale uses dots so the month and day swap"
WORDS = PHRASE.split(" ")


@pytest.fixture
async def sim() -> AsyncIterator[Any]:
    runner, url = await start_simulator(SimulatorConfig(models={MODEL: 8000}))
    simulator = runner.app[SIMULATOR]
    simulator.url = url
    yield simulator
    await runner.cleanup()


async def proxy_at(tmp_path: Path, sim_url: str, cached: float) -> Rig:
    config = tmp_path / "proxy.toml"
    config.write_text(CONFIG.format(url=sim_url, cached=cached))
    holder = ConfigHolder(load_settings(config))
    context = build_context_service(holder)
    runner, port = await serve_proxy(holder, context)
    return Rig(holder, runner, port, None, context)


def turn(i: int) -> list[dict[str, str]]:
    """One exchange of ~180 tokens: the agent's message, then the user's."""
    text = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(80))
    return [{"role": "assistant", "content": f"[{i}] {text}"}, {"role": "user", "content": f"[{i}] go on: {text}"}]


async def grow(rig: Rig, sim: Any) -> list[tuple[int, int, bool]]:
    """The session grown one exchange a turn until its request no longer fits the window: for each turn, the
    client's tokens, the tokens sent, and whether the upstream got the client's messages as written."""
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "The test suite fails on the date parser; find the bug and fix it."},
    ]
    seen = []
    async with openai.AsyncOpenAI(base_url=rig.base_url, api_key="sk-user-a", max_retries=0) as sdk:
        for i in range(60):
            messages = [*messages, *turn(i)]
            raw = await sdk.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, extra_headers={"X-Session-Id": "pressure"}
            )
            assert raw.status_code == 200 and raw.parse().choices[0].message.content
            before, after = int(raw.headers["X-Context-Tokens-Before"]), int(raw.headers["X-Context-Tokens-After"])
            seen.append((before, after, sim.requests[-1].body["messages"] == messages))
            if before > USABLE:
                return seen
    raise AssertionError("the conversation never outgrew the window")


async def grown_at(tmp_path: Path, sim: Any, cached: float) -> list[tuple[int, int, bool]]:
    """`grow` through a proxy whose model bills cached input at `cached` of the input price."""
    rig = await proxy_at(tmp_path, sim.url, cached=cached)
    try:
        return await grow(rig, sim)
    finally:
        await rig.close()


async def test_at_a_cheap_cached_price_the_request_goes_whole_until_it_no_longer_fits(tmp_path: Path, sim: Any):
    seen = await grown_at(tmp_path, sim, cached=0.1)
    pressed = [(before, after, whole) for before, after, whole in seen if 0.9 * USABLE < before <= USABLE]
    assert len(pressed) >= 2, seen  # turns above high_water that still fit the window
    assert all(whole and after == before for before, after, whole in pressed), pressed
    before, after, whole = seen[-1]  # the first request over the window: truncated to fit, answered
    assert not whole and after <= 0.6 * USABLE < before


async def test_where_cached_input_costs_full_price_it_truncates_at_high_water(tmp_path: Path, sim: Any):
    seen = await grown_at(tmp_path, sim, cached=1.0)
    first = next(k for k, (before, _, _) in enumerate(seen) if before > 0.9 * USABLE)
    before, after, whole = seen[first]
    assert before <= USABLE and not whole and after <= 0.6 * USABLE
