"""The shell in front of the project's simulator (the demo's upstream): the SDK sees no difference."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from proxy.simulator import SIMULATOR, SimulatorConfig, start_simulator

MESSAGES = [{"role": "user", "content": "Fix the failing test."}]


@pytest.fixture
async def sim():
    runner, url = await start_simulator(SimulatorConfig(chunks=6))
    yield runner.app[SIMULATOR], url
    await runner.cleanup()


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="sk-client", max_retries=0, timeout=10)


async def test_answers_through_the_proxy_match_the_direct_ones(sim, make_proxy):
    simulator, url = sim
    proxy = await make_proxy(url)
    direct = await client(url).chat.completions.create(model="sim-32k", messages=MESSAGES)
    proxied = await client(proxy.url).chat.completions.create(model="sim-32k", messages=MESSAGES)
    assert proxied.choices[0].message.content == direct.choices[0].message.content
    assert proxied.usage.prompt_tokens == direct.usage.prompt_tokens
    assert simulator.requests[-1].headers["Authorization"] == "Bearer sk-client"


async def test_simulated_pacing_survives_the_proxy(sim, make_proxy):
    _, url = sim
    proxy = await make_proxy(url)
    delay_s = 0.06
    stream = await client(proxy.url).chat.completions.create(
        model="sim-32k", messages=MESSAGES, stream=True, extra_headers={"X-Sim-Delay-Ms": str(delay_s * 1000)}
    )
    arrivals = [time.monotonic() async for _ in stream]
    assert len(arrivals) >= 6
    assert arrivals[-1] - arrivals[0] >= 0.5 * delay_s * (len(arrivals) - 1)


@pytest.mark.parametrize(("fault", "status"), [("reset-before-headers", 502), ("silence", 504)])
async def test_simulated_faults_before_headers_map_to_502_and_504(sim, make_proxy, fault, status):
    _, url = sim
    proxy = await make_proxy(url, read_timeout_s=0.3)
    with pytest.raises(openai.APIStatusError) as caught:
        await client(proxy.url).chat.completions.create(
            model="sim-32k", messages=MESSAGES, extra_headers={"X-Sim-Fault": fault}
        )
    assert caught.value.status_code == status


async def test_a_disconnect_reaches_the_simulator(sim, make_proxy):
    simulator, url = sim
    proxy = await make_proxy(url)
    stream = await client(proxy.url).chat.completions.create(
        model="sim-32k", messages=MESSAGES, stream=True, extra_headers={"X-Sim-Delay-Ms": "2000"}
    )
    await stream.__anext__()
    await stream.close()
    for _ in range(100):
        if simulator.totals.disconnects:
            break
        await asyncio.sleep(0.02)
    assert simulator.totals.disconnects == 1
