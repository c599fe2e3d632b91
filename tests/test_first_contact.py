"""What a new user meets on a running proxy: 502s that say why, the window it assumed, savings that read right."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import aiohttp
import openai
import pytest
from pydantic import BaseModel

from proxy.demo.simulator import start_simulator
from tests.harness import closed_port, listening_port
from tests.served import serve, write_config

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


@pytest.fixture
async def packaged_proxy():
    """The simulator and a proxy running the packaged config (its model table), as `context-proxy serve` would."""
    from proxy.config.loader import ConfigHolder, load_settings
    from proxy.service.engine_service import build_context_service
    from proxy.shell import server

    sim_runner, sim_url = await start_simulator()
    holder = ConfigHolder(load_settings(upstream_url=sim_url), upstream_url=sim_url)
    runner, port = await server.start(holder, "127.0.0.1", 0, context=build_context_service(holder))
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()
    await sim_runner.cleanup()


async def session_report(root: str, session: str) -> dict:
    async with aiohttp.ClientSession() as http, http.get(f"{root}/sessions/{session}") as response:
        return await response.json()


async def test_every_answer_says_the_window_used_and_the_sessions_view_its_model_entry(packaged_proxy, caplog):
    caplog.set_level("WARNING", logger="proxy.service")
    sdk = client(f"{packaged_proxy}/s/window-check/v1")
    known = await sdk.chat.completions.with_raw_response.create(model="gpt-4o-2024-08-06", messages=MESSAGES)
    assert known.headers["X-Context-Window"] == "128000"
    for _ in range(2):
        guessed = await sdk.chat.completions.with_raw_response.create(model="my-local-llm", messages=MESSAGES)
        assert guessed.headers["X-Context-Window"] == "128000"
    turns = (await session_report(packaged_proxy, "window-check"))["turn_details"]
    assert [(t["model"], t["window"], t["model_entry"]) for t in turns] == [
        ("gpt-4o-2024-08-06", 128000, "gpt-4o*"),
        ("my-local-llm", 128000, "*"),
        ("my-local-llm", 128000, "*"),
    ]
    warnings = [r.getMessage() for r in caplog.records if "my-local-llm" in r.getMessage()]
    assert len(warnings) == 1 and "assuming a 128000-token window" in warnings[0]
    assert not [r for r in caplog.records if "gpt-4o" in r.getMessage()]


async def test_a_session_the_proxy_left_alone_never_reads_as_a_loss(packaged_proxy):
    """Short turns: the upstream caches nothing (under 1,024 tokens), so neither would a direct request."""
    sdk = client(f"{packaged_proxy}/s/left-alone/v1")
    history = [{"role": "system", "content": "You are terse."}]
    for turn in range(4):
        history.append({"role": "user", "content": f"Question {turn}: what is {turn} + {turn}?"})
        answer = await sdk.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": answer.choices[0].message.content})
    report = await session_report(packaged_proxy, "left-alone")
    assert report["saved_usd"] == 0 and report["cost_usd"] > 0
    assert all(t["banked"] == 0 for t in report["turn_details"])  # nor does the engine count any saving
    assert all(t["cost_usd"] == t["direct_cost_usd"] for t in report["turn_details"])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_the_first_request_of_a_fresh_process_costs_what_any_other_does(tmp_path):
    """Each model's tokenizer is loaded before the proxy listens: no client's first turn pays for it."""
    sim_runner, sim_url = await start_simulator()
    proxy = serve(write_config(tmp_path), upstream_url=sim_url)
    try:
        sdk = client(f"{proxy.root}/v1")
        cpu = []
        for round_ in ("first", "later"):  # each round: a new session per tokenizer (o200k_base, cl100k_base)
            before = _cpu_seconds(proxy.process.pid)
            for model in ("gpt-4o", "gpt-4"):
                text = f"{round_} request for {model}: " + " ".join(f"word{i}" for i in range(200))
                await sdk.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": text}], extra_headers={"X-Session-Id": text}
                )
            cpu.append(_cpu_seconds(proxy.process.pid) - before)
        assert cpu[0] < cpu[1] + 0.15, cpu  # loading o200k_base alone is 0.4-1.1 s of CPU
    finally:
        proxy.stop()
        await sim_runner.cleanup()
