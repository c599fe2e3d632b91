"""What a new user meets on a running proxy: 502s that say why, the window it assumed, savings that read right."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Literal

import aiohttp
import openai
import pytest
from pydantic import BaseModel

from proxy.simulator import start_simulator
from tests.harness import closed_port, listening_port

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


class Step(BaseModel):
    explanation: str
    output: str


class Review(BaseModel):
    verdict: Literal["approve", "reject"]
    score: int
    steps: list[Step]
    note: str | None


async def test_structured_outputs_parse_against_the_simulator_through_the_proxy(make_rig):
    rig = await make_rig()
    done = await client(rig.base_url).chat.completions.parse(model="gpt-4o", messages=MESSAGES, response_format=Review)
    review = done.choices[0].message.parsed
    assert isinstance(review, Review) and review.verdict == "approve" and len(review.steps) == 1
    asked = await client(rig.base_url).chat.completions.create(
        model="gpt-4o", messages=MESSAGES, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(asked.choices[0].message.content), dict)


async def test_a_model_is_retrieved_by_id_and_an_unknown_one_is_openais_404(make_rig):
    rig = await make_rig()
    assert (await client(rig.base_url).models.retrieve("gpt-4o")).id == "gpt-4o"
    with pytest.raises(openai.NotFoundError) as caught:
        await client(rig.base_url).models.retrieve("gpt-nonesuch")
    assert caught.value.code == "model_not_found"


async def test_metrics_have_one_prefix_counters_at_zero_and_process_metrics(tmp_path):
    """A fresh `context-proxy serve`: before any request every metric is there, named context_proxy_* or process_*."""
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", "0"], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        port = listening_port(process)
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
    finally:
        process.terminate()
        process.wait(timeout=10)
    names = {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert names and all(name.startswith(("context_proxy_", "process_")) for name in names), names
    for zero in ("context_proxy_engine_errors_total 0", "context_proxy_messages_reused_total 0"):
        assert zero in text.splitlines()
    assert any(line.startswith("process_resident_memory_bytes ") for line in text.splitlines())
