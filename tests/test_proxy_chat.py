"""Chat completions through the proxy with the official SDK: answers, streams, tools, the engine seam."""

from __future__ import annotations

import asyncio
import itertools
import time

import aiohttp
import openai
import pytest

from proxy.demo.simulator import SimulatorConfig
from proxy.errors import ContextOverflow
from tests.conftest import RecordingService

MODEL = "gpt-4o-mini"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]
PACE_S = 0.08  # between the chunks of a paced stream
PACED_CHUNKS = 5
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
# Over sim-1k's window; its last message alone fits (RecordingService refits to the last message).
OVERFLOWING = [{"role": "user", "content": "word " * 1500}, {"role": "user", "content": "Say hello."}]


def async_client(url: str, key: str = "sk-client") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=10)


async def test_non_streaming_answer_reaches_the_async_and_sync_sdk(rig):
    answer = await async_client(rig.base_url).chat.completions.create(model=MODEL, messages=MESSAGES)
    assert answer.choices[0].message.content == rig.sim.config.answer
    assert answer.usage.prompt_tokens == rig.sim.totals.prompt_tokens

    def sync_call() -> str:
        client = openai.OpenAI(base_url=rig.base_url, api_key="sk-client", max_retries=0, timeout=10)
        return client.chat.completions.create(model=MODEL, messages=MESSAGES).choices[0].message.content

    assert await asyncio.to_thread(sync_call) == rig.sim.config.answer
    assert rig.sim.requests[-1].body["messages"] == MESSAGES


async def test_stream_chunks_arrive_as_the_upstream_paces_them(rig):
    arrivals = []
    pacing = {"X-Sim-Delay-Ms": str(PACE_S * 1000), "X-Sim-Chunks": str(PACED_CHUNKS)}
    stream = await async_client(rig.base_url).chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, extra_headers=pacing
    )
    text = ""
    async for chunk in stream:
        arrivals.append(time.monotonic())
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text == rig.sim.config.answer
    content_arrivals = arrivals[:PACED_CHUNKS]
    gaps = [b - a for a, b in itertools.pairwise(content_arrivals)]
    # Buffered, they would land together; relayed, each waits for the upstream's pause.
    assert content_arrivals[-1] - content_arrivals[0] >= 0.5 * PACE_S * (PACED_CHUNKS - 1)
    assert sum(gap >= 0.5 * PACE_S for gap in gaps) >= len(gaps) - 1


async def test_sync_sdk_streams_too(rig):
    def sync_stream() -> list[str]:
        client = openai.OpenAI(base_url=rig.base_url, api_key="sk-client", max_retries=0, timeout=10)
        stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        return [c.choices[0].delta.content or "" for c in stream if c.choices]

    assert "".join(await asyncio.to_thread(sync_stream)) == rig.sim.config.answer


async def test_tool_calls_round_trip_streaming_and_not(rig):
    client = async_client(rig.base_url)
    one_call = {"X-Sim-Tool-Calls": "1"}
    answer = await client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, extra_headers=one_call)
    call = answer.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == ("read_file", '{"path": "ls -la"}')
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, stream=True, extra_headers=one_call
    )
    deltas = [c.choices[0].delta for c in [c async for c in stream] if c.choices]
    assert next(d for d in deltas if d.tool_calls).tool_calls[0].function.name == "read_file"
    follow_up = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "print('a')"},
    ]
    answer = await client.chat.completions.create(model=MODEL, messages=follow_up)
    assert answer.choices[0].finish_reason == "stop"


async def test_session_path_prefix_reaches_the_engine_and_headers_reach_the_client(make_rig):
    service = RecordingService()
    rig = await make_rig(context=service)
    client = async_client(f"{rig.root}/s/agent-7/v1", key="sk-user")
    raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES)
    assert raw.headers["x-context-tokens-before"] == "100"
    assert raw.headers["x-context-tokens-after"] == "60"
    assert service.calls[0]["path_session"] == "agent-7"
    assert service.calls[0]["credential"] == "sk-user"
    assert service.turns[0].usages == [raw.http_response.json()["usage"]]
    assert rig.sim.requests[-1].path == "/v1/chat/completions"


async def test_usage_chunk_is_captured_and_stripped_when_the_engine_asked_for_it(make_rig):
    service = RecordingService(strip_usage_chunk=True)
    rig = await make_rig(context=service)
    stream = await async_client(rig.base_url).chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    chunks = [c async for c in stream]
    assert all(c.choices for c in chunks), "the usage-only chunk reached the client"
    assert rig.sim.requests[-1].body["stream_options"] == {"include_usage": True}
    billed = (rig.sim.totals.prompt_tokens, rig.sim.totals.completion_tokens)
    assert [(u["prompt_tokens"], u["completion_tokens"]) for u in service.turns[0].usages] == [billed]


async def test_usage_chunk_the_client_asked_for_is_kept(make_rig):
    service = RecordingService(strip_usage_chunk=False)
    rig = await make_rig(context=service)
    stream = await async_client(rig.base_url).chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    billed = rig.sim.totals.prompt_tokens + rig.sim.totals.completion_tokens
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == billed
    assert service.turns[0].usages == [chunks[-1].usage.model_dump(exclude_unset=True)]


async def test_context_overflow_is_refitted_and_retried_once(make_rig):
    service = RecordingService()
    rig = await make_rig(sim_config=SimulatorConfig(models={"sim-1k": 1000}), context=service)
    answer = await async_client(rig.base_url).chat.completions.create(model="sim-1k", messages=OVERFLOWING)
    assert answer.choices[0].message.content == rig.sim.config.answer
    assert service.turns[0].refits == [rig.sim.measure("sim-1k", None, OVERFLOWING)[0]]
    assert rig.sim.totals.refused == 1 and rig.sim.requests[-1].body["messages"] == OVERFLOWING[-1:]


async def test_context_overflow_passes_through_when_the_engine_cannot_refit(make_rig):
    rig = await make_rig(sim_config=SimulatorConfig(models={"sim-1k": 1000}), context=RecordingService(refit=False))
    with pytest.raises(openai.BadRequestError) as caught:
        await async_client(rig.base_url).chat.completions.create(model="sim-1k", messages=OVERFLOWING)
    assert caught.value.code == "context_length_exceeded"
    assert f"resulted in {rig.sim.measure('sim-1k', None, OVERFLOWING)[0]} tokens" in caught.value.message


async def test_engine_rejection_is_a_local_error_in_openai_shape(make_rig):
    service = RecordingService(fail_with=ContextOverflow("too long for the window"))
    rig = await make_rig(context=service)
    with pytest.raises(openai.BadRequestError) as caught:
        await async_client(rig.base_url).chat.completions.create(model=MODEL, messages=MESSAGES)
    assert caught.value.code == "context_length_exceeded"
    assert list(rig.sim.requests) == []


async def test_an_engine_bug_forwards_the_request_unchanged(make_rig):
    rig = await make_rig(context=RecordingService(fail_with=RuntimeError("bug")))
    answer = await async_client(rig.base_url).chat.completions.create(model=MODEL, messages=MESSAGES)
    assert answer.choices[0].message.content
    assert rig.sim.requests[-1].body["messages"] == MESSAGES


async def test_client_authorization_passes_through_without_a_configured_key(rig):
    await async_client(rig.base_url, key="sk-client-own").chat.completions.create(model=MODEL, messages=MESSAGES)
    assert rig.sim.requests[-1].headers["Authorization"] == "Bearer sk-client-own"


async def test_configured_key_replaces_the_clients(make_rig, monkeypatch):
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", "sk-upstream-secret")
    rig = await make_rig(upstream={"api_key_env": "FAKE_UPSTREAM_KEY"})
    client = async_client(rig.base_url, key="sk-client-should-not-leave")
    await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    await client.models.list()
    assert len(rig.sim.requests) == 2
    for seen in rig.sim.requests:
        assert seen.headers["Authorization"] == "Bearer sk-upstream-secret"
        assert "sk-client-should-not-leave" not in str(seen.headers)


async def test_a_missing_configured_key_never_falls_back_to_the_clients(make_rig, monkeypatch):
    monkeypatch.delenv("FAKE_UPSTREAM_KEY", raising=False)
    rig = await make_rig(upstream={"api_key_env": "FAKE_UPSTREAM_KEY"})
    with pytest.raises(openai.APIStatusError) as caught:
        await async_client(rig.base_url).chat.completions.create(model=MODEL, messages=MESSAGES)
    assert caught.value.status_code == 502 and list(rig.sim.requests) == []


async def test_the_clients_user_agent_goes_upstream_and_none_stands_in_for_a_missing_one(rig):
    body = {"model": MODEL, "messages": MESSAGES}
    async with aiohttp.ClientSession(skip_auto_headers=("User-Agent",)) as http:
        for agent in ("my-agent/1.0", None):
            headers = {"User-Agent": agent} if agent else {}
            async with http.post(rig.base_url + "/chat/completions", json=body, headers=headers) as response:
                assert response.status == 200
            assert rig.sim.requests[-1].headers.get("User-Agent") == agent  # never aiohttp's own
