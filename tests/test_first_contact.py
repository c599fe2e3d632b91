"""What a new user meets on a running proxy: 502s that say why, the window it assumed, savings that read right."""

from __future__ import annotations

import openai
import pytest

from proxy.simulator import start_simulator
from tests.harness import closed_port

MESSAGES = [{"role": "user", "content": "Say hello."}]


def client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0, timeout=10)


async def bad_gateway(base_url: str, **headers: str) -> str:
    with pytest.raises(openai.APIStatusError) as caught:
        await client(base_url).chat.completions.create(model="gpt-4o", messages=MESSAGES, extra_headers=headers)
    assert caught.value.status_code == 502 and caught.value.code == "upstream_unreachable"
    return caught.value.message


async def test_a_refused_connection_names_the_upstream_and_the_cause(make_rig):
    port = closed_port()
    rig = await make_rig(upstream_url=f"http://127.0.0.1:{port}/v1")
    assert f"upstream 127.0.0.1:{port} could not be reached: connection refused" in await bad_gateway(rig.base_url)


async def test_tls_to_a_plain_http_upstream_names_the_tls_failure(make_rig):
    sim_runner, sim_url = await start_simulator()
    try:
        tls_url = sim_url.replace("http://", "https://")
        rig = await make_rig(upstream_url=tls_url)
        port = tls_url.split(":")[2].split("/")[0]
        assert f"upstream 127.0.0.1:{port} could not be reached: TLS handshake failed" in await bad_gateway(
            rig.base_url
        )
    finally:
        await sim_runner.cleanup()


async def test_a_reset_before_the_answer_names_the_reset(make_rig):
    rig = await make_rig()
    message = await bad_gateway(rig.base_url, **{"X-Sim-Fault": "reset-before-headers"})
    assert "could not be reached: connection" in message and rig.sim_url.split("/")[2] in message
