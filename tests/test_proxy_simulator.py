"""The shell in front of the project's simulator (the demo's upstream): the SDK sees no difference."""

from __future__ import annotations

import time

import openai
import pytest

from proxy.demo.simulator import SimulatorConfig
from tests.harness import settle

MESSAGES = [{"role": "user", "content": "Fix the failing test."}]


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="sk-client", max_retries=0, timeout=10)


async def test_answers_through_the_proxy_match_the_direct_ones(rig):
    direct = await client(rig.sim_url).chat.completions.create(model="sim-32k", messages=MESSAGES)
    proxied = await client(rig.base_url).chat.completions.create(model="sim-32k", messages=MESSAGES)
    assert proxied.choices[0].message.content == direct.choices[0].message.content
    assert proxied.usage.prompt_tokens == direct.usage.prompt_tokens
    assert rig.sim.requests[-1].headers["Authorization"] == "Bearer sk-client"


async def test_simulated_pacing_survives_the_proxy(make_rig):
    rig = await make_rig(sim_config=SimulatorConfig(chunks=6))
    delay_s = 0.06
    stream = await client(rig.base_url).chat.completions.create(
        model="sim-32k", messages=MESSAGES, stream=True, extra_headers={"X-Sim-Delay-Ms": str(delay_s * 1000)}
    )
    arrivals = [time.monotonic() async for _ in stream]
    assert len(arrivals) >= 6
    assert arrivals[-1] - arrivals[0] >= 0.5 * delay_s * (len(arrivals) - 1)


@pytest.mark.parametrize(("fault", "status"), [("reset-before-headers", 502), ("silence", 504)])
async def test_simulated_faults_before_headers_map_to_502_and_504(make_rig, fault, status):
    rig = await make_rig(upstream={"read_timeout_s": 0.3})
    with pytest.raises(openai.APIStatusError) as caught:
        await client(rig.base_url).chat.completions.create(
            model="sim-32k", messages=MESSAGES, extra_headers={"X-Sim-Fault": fault}
        )
    assert caught.value.status_code == status


async def test_a_disconnect_reaches_the_simulator(rig):
    stream = await client(rig.base_url).chat.completions.create(
        model="sim-32k", messages=MESSAGES, stream=True, extra_headers={"X-Sim-Delay-Ms": "2000"}
    )
    await stream.__anext__()
    await stream.close()
    assert await settle(lambda: rig.sim.totals.disconnects > 0)
    assert rig.sim.totals.disconnects == 1
