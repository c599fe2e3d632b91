"""The real ContextService through the real HTTP path: proxy + simulator on 127.0.0.1, the official SDK.

Config comes from TOML files (a model table with a small window, a session file for "agent-*"),
so what runs here is what `context-proxy serve` runs.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from proxy.config.loader import ConfigHolder, load_settings
from proxy.context.tokens import canonical_bytes
from proxy.demo.simulator import SIMULATOR, SimulatorConfig, start_simulator
from proxy.service import turn_metrics
from proxy.service.engine_service import build_context_service
from tests.harness import Rig, serve_proxy

MODEL = "sim-8k"
SYSTEM = {"role": "system", "content": "You are a careful coding agent working in a Python repository."}
TASK = {"role": "user", "content": "The test suite fails on the date parser; find the bug and fix it."}

CONFIG = """
[upstream]
base_url = "{url}"
connect_timeout_s = 2
read_timeout_s = 10

[state]
max_sessions = {max_sessions}
path = "{state_path}"

[models."sim-*"]
context_window = 8000
encoding = "o200k_base"
input_per_mtok = 1.0
cached_input_per_mtok = 0.1
output_per_mtok = 4.0

[policy]
reserve_output_tokens = 500
high_water = {high_water}
low_water = {low_water}

[policy.clear_tool_outputs]
keep_tokens = 800
keep_under = 50
clear_at_least = 200
"""

AGENTS = """
match = ["agent-*"]
[policy]
pin_first_user = true
"""


async def start(
    tmp_path: Path,
    sim_url: str,
    *,
    max_sessions: int = 100,
    state_path: str = "",
    high_water: float = 0.9,
    low_water: float = 0.6,
) -> Rig:
    """A proxy with the real ContextService, configured from files in `tmp_path`."""
    (tmp_path / "sessions").mkdir(parents=True, exist_ok=True)
    (tmp_path / "sessions" / "agents.toml").write_text(AGENTS)
    config = tmp_path / "proxy.toml"
    config.write_text(
        CONFIG.format(
            url=sim_url, max_sessions=max_sessions, state_path=state_path, high_water=high_water, low_water=low_water
        )
    )
    holder = ConfigHolder(load_settings(config))
    context = build_context_service(holder)
    runner, port = await serve_proxy(holder, context)
    return Rig(holder, runner, port, None, context)


@pytest.fixture
async def sim() -> AsyncIterator[Any]:
    config = SimulatorConfig(models={MODEL: 8000}, hidden_tokens_per_message=1)
    runner, url = await start_simulator(config)
    simulator = runner.app[SIMULATOR]
    simulator.url = url
    yield simulator
    await runner.cleanup()


@pytest.fixture
async def rig(tmp_path: Path, sim: Any) -> AsyncIterator[Rig]:
    rig = await start(tmp_path, sim.url)
    yield rig
    await rig.close()


async def ask(rig: Rig, messages: list[dict[str, Any]], *, key: str = "sk-user-a", base: str = "", **kwargs: Any):
    """One chat completion through the proxy with the official SDK; the raw response (headers, parse())."""
    async with openai.AsyncOpenAI(base_url=base or rig.base_url, api_key=key, max_retries=0) as sdk:
        return await sdk.chat.completions.with_raw_response.create(model=MODEL, messages=messages, **kwargs)


async def ask_stream(rig: Rig, messages: list[dict[str, Any]], **kwargs: Any) -> list[Any]:
    async with openai.AsyncOpenAI(base_url=rig.base_url, api_key="sk-user-a", max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(model=MODEL, messages=messages, stream=True, **kwargs)
        return [chunk async for chunk in stream]


async def get_json(rig: Rig, path: str) -> Any:
    async with aiohttp.ClientSession() as http, http.get(rig.root + path) as response:
        assert response.status == 200, await response.text()
        return await response.json()


def file_text(i: int) -> str:
    return "\n".join(f"def parse_{i}_{j}(value): return value.split('-')[{j % 3}]  # step {j}" for j in range(20))


def agent_turns(n: int) -> list[dict[str, Any]]:
    """An agent's history after `n` tool calls: each turn ends with the newest tool output."""
    messages = [SYSTEM, TASK]
    for i in range(n):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "read_file", "arguments": f'{{"n": {i}}}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": file_text(i)})
    return messages


def upstream_messages(sim: Any) -> list[bytes]:
    """The last chat request the simulator received, one canonical byte string per message."""
    chats = [r for r in sim.requests if r.path.endswith("/chat/completions")]
    return [canonical_bytes(m) for m in chats[-1].body["messages"]]


async def test_headers_and_session_report(rig: Rig, sim: Any) -> None:
    raw = await ask(rig, [SYSTEM, TASK], extra_headers={"X-Session-Id": "agent-7"})
    assert raw.parse().choices[0].message.content
    for name in ("X-Context-Tokens-Before", "X-Context-Tokens-After", "X-Context-Diff", "X-Context-Epoch"):
        assert raw.headers.get(name), name
    assert raw.headers["X-Context-Diff"].startswith("added=")

    listing = await get_json(rig, "/sessions")
    assert [row["id"] for row in listing] == ["agent-7"]
    assert listing[0]["policy"] == "agents" and listing[0]["turns"] == 1
    assert TASK["content"] not in json.dumps(listing)

    report = await get_json(rig, "/sessions/agent-7")
    turn = report["turn_details"][0]
    for key in ("tokens_before", "tokens_after", "epoch", "reasons", "cleared", "diff", "prompt_tokens"):
        assert key in turn, key
    assert turn["prompt_tokens"] > 0 and turn["cached_tokens"] == 0
    assert turn["cost_usd"] > 0 and turn["direct_cost_usd"] >= turn["cost_usd"]
    async with aiohttp.ClientSession() as http, http.get(rig.root + "/sessions/nobody") as response:
        assert response.status == 404


async def test_usage_chunk_is_asked_for_and_stripped_when_the_client_did_not_ask(rig: Rig, sim: Any) -> None:
    chunks = await ask_stream(rig, [SYSTEM, TASK], extra_headers={"X-Session-Id": "quiet"})
    assert chunks and all(chunk.usage is None for chunk in chunks)
    assert sim.requests[-1].body["stream_options"] == {"include_usage": True}
    report = await get_json(rig, "/sessions/quiet")
    assert report["turn_details"][0]["prompt_tokens"] > 0  # the proxy read the chunk it dropped


async def test_usage_chunk_is_kept_for_a_client_that_asked(rig: Rig, sim: Any) -> None:
    chunks = await ask_stream(
        rig, [SYSTEM, TASK], stream_options={"include_usage": True}, extra_headers={"X-Session-Id": "asks"}
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
    assert (await get_json(rig, "/sessions/asks"))["turn_details"][0]["prompt_tokens"] == chunks[-1].usage.prompt_tokens


async def test_two_users_with_the_same_system_prompt_never_share_a_session(rig: Rig, sim: Any) -> None:
    long_history = agent_turns(12)
    for n in (4, 8, 12):
        await ask(rig, long_history[: 2 + 2 * n], key="sk-user-a")
    await ask(rig, [SYSTEM, TASK], key="sk-user-b")
    assert upstream_messages(sim) == [canonical_bytes(SYSTEM), canonical_bytes(TASK)]

    rows = {row["turns"]: row for row in await get_json(rig, "/sessions")}
    assert sorted(rows) == [1, 3] and rows[1]["id"] != rows[3]["id"]
    assert rows[1]["tokens_before"] < rows[3]["tokens_before"]


async def test_two_clients_naming_the_same_session_never_share_its_state(rig: Rig, sim: Any) -> None:
    long_history = agent_turns(12)
    same = {"X-Session-Id": "agent-shared"}
    for n in (4, 8, 12):
        await ask(rig, long_history[: 2 + 2 * n], key="sk-user-a", extra_headers=same)
    await ask(rig, [SYSTEM, TASK], key="sk-user-b", extra_headers=same)
    assert upstream_messages(sim) == [canonical_bytes(SYSTEM), canonical_bytes(TASK)]

    rows = [row for row in await get_json(rig, "/sessions") if row["id"] == "agent-shared"]
    assert sorted(row["turns"] for row in rows) == [1, 3]
    assert rows[0]["key"] != rows[1]["key"]
    await ask(rig, long_history[: 2 + 2 * 12], key="sk-user-a", extra_headers=same)
    assert (await get_json(rig, "/sessions/" + rows[[r["turns"] for r in rows].index(3)]["key"]))["turns"] == 4


async def test_sessions_beyond_max_sessions_are_evicted_oldest_first(tmp_path: Path, sim: Any) -> None:
    rig = await start(tmp_path, sim.url, max_sessions=2)
    try:
        for name in ("s1", "s2", "s3"):
            base = f"{rig.root}/s/{name}/v1"
            await ask(rig, [SYSTEM, TASK], base=base)
        assert {row["id"] for row in await get_json(rig, "/sessions")} == {"s2", "s3"}
    finally:
        await rig.close()


async def test_metrics_are_per_policy_never_per_session(rig: Rig, sim: Any) -> None:
    before = turn_metrics.TOKENS_BEFORE.value(policy="agents")
    epochs = turn_metrics.EPOCHS.value(policy="agents")
    history = agent_turns(24)
    for n in range(1, 25):
        await ask(rig, history[: 2 + 2 * n], extra_headers={"X-Session-Id": "agent-metrics"})
    assert turn_metrics.TOKENS_BEFORE.value(policy="agents") > before
    assert turn_metrics.EPOCHS.value(policy="agents") > epochs
    assert 1.0 <= rig.context.ratios[MODEL] < 1.1  # learned from usage: the simulator counts a little more
    async with aiohttp.ClientSession() as http, http.get(rig.root + "/metrics") as response:
        text = await response.text()
    assert 'context_proxy_tokens_saved_total{policy="agents"}' in text
    assert 'context_proxy_upstream_cached_tokens_total{policy="agents"}' in text
    assert 'context_proxy_estimated_saved_usd{policy="agents"}' in text
    assert "agent-metrics" not in text


async def test_a_restart_with_state_path_replays_the_same_decisions(tmp_path: Path, sim: Any) -> None:
    state_path = str(tmp_path / "state.sqlite")
    history = agent_turns(18)

    async def turn(rig: Rig, n: int) -> str:
        raw = await ask(rig, history[: 2 + 2 * n], extra_headers={"X-Session-Id": "agent-restart"})
        cached.append(raw.parse().usage.prompt_tokens_details.cached_tokens)
        return raw.headers["X-Context-Epoch"]

    cached: list[int] = []

    rig = await start(tmp_path, sim.url, state_path=state_path)
    try:
        epochs = [await turn(rig, n) for n in range(1, 18)]
        assert "1" in epochs  # the journal holds decisions worth replaying
    finally:
        await rig.close()
    before = upstream_messages(sim)

    rig = await start(tmp_path, sim.url, state_path=state_path)
    try:
        assert await turn(rig, 18) == "0"
        after = upstream_messages(sim)
        assert after[: len(before)] == before and len(after) == len(before) + 2
        assert cached[-1] > 0  # the upstream's prompt cache still hits after the restart
        assert (await get_json(rig, "/sessions/agent-restart"))["turns"] == 18
    finally:
        await rig.close()

    fresh = await start(tmp_path / "fresh", sim.url)  # control: without the file the decisions differ
    try:
        assert await turn(fresh, 18) == "1"
        assert upstream_messages(sim)[: len(before)] != before
    finally:
        await fresh.close()


PHRASE = "the parser splits on dashes but the locale uses dots so the month and day swap"


def chatter(n: int) -> list[dict[str, Any]]:
    """A long conversation of short messages: the upstream's hidden per-message framing adds up."""
    words = PHRASE.split(" ")
    messages = [SYSTEM, TASK]
    for i in range(n):
        role = "assistant" if i % 2 == 0 else "user"
        messages.append({"role": role, "content": f"[{i}] " + " ".join(words[(i + j) % len(words)] for j in range(90))})
    messages.append({"role": "user", "content": "Go on."})
    return messages


async def test_an_upstream_overflow_is_refitted_and_retried_invisibly(tmp_path: Path) -> None:
    runner, url = await start_simulator(SimulatorConfig(models={MODEL: 8000}, hidden_tokens_per_message=30))
    sim = runner.app[SIMULATOR]
    rig = await start(tmp_path, url, high_water=1.0, low_water=0.9)
    try:
        history = chatter(64)
        raw = await ask(rig, history, max_tokens=200, extra_headers={"X-Session-Id": "tight"})
        assert raw.status_code == 200 and raw.parse().choices[0].message.content
        assert sim.totals.refused == 1 and sim.totals.answered == 1
        first, retry = (r.body["messages"] for r in sim.requests)
        assert len(retry) < len(first) and retry[-1] == history[-1]
        report = await get_json(rig, "/sessions/tight")
        assert report["correction"] > 1.0 and report["turn_details"][0]["retried"] is True

        history = [*history, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Again."}]
        await ask(rig, history, max_tokens=200, extra_headers={"X-Session-Id": "tight"})
        assert sim.totals.refused == 1  # the correction was remembered
    finally:
        await rig.close()
        await runner.cleanup()


async def test_a_turn_the_engine_left_alone_goes_upstream_as_the_clients_own_bytes(rig: Rig, sim: Any) -> None:
    """No edit, no injection, no stream_options added: the upstream gets the exact bytes (formatting, key order)."""
    body = {"model": MODEL, "messages": [SYSTEM, TASK], "temperature": 0}
    raw = json.dumps(body, indent=1, ensure_ascii=True).encode() + b"\n"
    headers = {"Authorization": "Bearer sk-user-a", "Content-Type": "application/json", "X-Session-Id": "as-sent"}
    async with aiohttp.ClientSession() as http:
        async with http.post(rig.base_url + "/chat/completions", data=raw, headers=headers) as response:
            assert response.status == 200
        assert sim.requests[-1].raw == raw
        streamed = json.dumps({**body, "stream": True}).encode()  # the proxy adds include_usage: re-serialised
        async with http.post(rig.base_url + "/chat/completions", data=streamed, headers=headers) as response:
            assert response.status == 200
            await response.read()
        assert sim.requests[-1].raw != streamed
        assert sim.requests[-1].body == {**body, "stream": True, "stream_options": {"include_usage": True}}


async def test_a_compressed_request_body_is_forwarded_decoded_without_its_encoding_header(rig: Rig, sim: Any) -> None:
    raw = json.dumps({"model": MODEL, "messages": [SYSTEM, TASK]}).encode()
    headers = {"Authorization": "Bearer sk-user-a", "Content-Type": "application/json", "Content-Encoding": "gzip"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(rig.base_url + "/chat/completions", data=gzip.compress(raw), headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
    assert sim.requests[-1].raw == raw
    assert "Content-Encoding" not in sim.requests[-1].headers


async def test_a_compressed_body_on_another_route_reaches_the_upstream_intact(rig: Rig, sim: Any) -> None:
    raw = json.dumps({"model": "text-embedding-3-small", "input": "hello " * 200}).encode()
    headers = {"Authorization": "Bearer sk-user-a", "Content-Type": "application/json", "Content-Encoding": "gzip"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(rig.base_url + "/embeddings", data=gzip.compress(raw), headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
    sent = sim.requests[-1]
    assert (gzip.decompress(sent.raw) if "Content-Encoding" in sent.headers else sent.raw) == raw
