"""Chat completions through the proxy with the official SDK: answers, streams, tools, the engine seam."""

from __future__ import annotations

import asyncio
import itertools
import time

import openai
import orjson
import pytest

from proxy.turns import Rejected
from tests.conftest import PACE_S, PACED_CHUNKS, USAGE, RecordingService

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]


def async_client(url: str, key: str = "sk-client") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=10)


async def test_non_streaming_answer_reaches_the_async_and_sync_sdk(upstream, proxy):
    answer = await async_client(proxy.url).chat.completions.create(model="echo", messages=MESSAGES)
    assert answer.choices[0].message.content == "Hello from the fake upstream"
    assert answer.usage.prompt_tokens == USAGE["prompt_tokens"]

    def sync_call() -> str:
        client = openai.OpenAI(base_url=proxy.url, api_key="sk-client", max_retries=0, timeout=10)
        return client.chat.completions.create(model="echo", messages=MESSAGES).choices[0].message.content

    assert await asyncio.to_thread(sync_call) == "Hello from the fake upstream"
    assert orjson.loads(upstream.last.body)["messages"] == MESSAGES


async def test_stream_chunks_arrive_as_the_upstream_paces_them(proxy):
    arrivals = []
    stream = await async_client(proxy.url).chat.completions.create(model="paced", messages=MESSAGES, stream=True)
    text = ""
    async for chunk in stream:
        arrivals.append(time.monotonic())
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text == "Hello from the fake upstream"
    content_arrivals = arrivals[:PACED_CHUNKS]
    gaps = [b - a for a, b in itertools.pairwise(content_arrivals)]
    # Buffered, they would land together; relayed, each waits for the upstream's pause.
    assert content_arrivals[-1] - content_arrivals[0] >= 0.5 * PACE_S * (PACED_CHUNKS - 1)
    assert sum(gap >= 0.5 * PACE_S for gap in gaps) >= len(gaps) - 1


async def test_sync_sdk_streams_too(proxy):
    def sync_stream() -> list[str]:
        client = openai.OpenAI(base_url=proxy.url, api_key="sk-client", max_retries=0, timeout=10)
        stream = client.chat.completions.create(model="echo", messages=MESSAGES, stream=True)
        return [c.choices[0].delta.content or "" for c in stream if c.choices]

    assert "".join(await asyncio.to_thread(sync_stream)) == "Hello from the fake upstream"


async def test_tool_calls_round_trip_streaming_and_not(proxy):
    client = async_client(proxy.url)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    answer = await client.chat.completions.create(model="tools", messages=MESSAGES, tools=tools)
    call = answer.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == ("read_file", '{"path": "a.py"}')
    stream = await client.chat.completions.create(model="tools", messages=MESSAGES, tools=tools, stream=True)
    deltas = [c.choices[0].delta for c in [c async for c in stream] if c.choices]
    assert deltas[0].tool_calls[0].function.name == "read_file"
    follow_up = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "print('a')"},
    ]
    answer = await client.chat.completions.create(model="echo", messages=follow_up)
    assert answer.choices[0].finish_reason == "stop"


async def test_session_path_prefix_reaches_the_engine_and_headers_reach_the_client(upstream, make_proxy):
    service = RecordingService()
    proxy = await make_proxy(upstream.url, context=service)
    client = async_client(f"{proxy.root}/s/agent-7/v1", key="sk-user")
    raw = await client.chat.completions.with_raw_response.create(model="echo", messages=MESSAGES)
    assert raw.headers["x-context-tokens-before"] == "100"
    assert raw.headers["x-context-tokens-after"] == "60"
    assert service.calls[0]["path_session"] == "agent-7"
    assert service.calls[0]["credential"] == "sk-user"
    assert service.turns[0].usages == [USAGE]
    assert upstream.last.path_qs == "/v1/chat/completions"


async def test_usage_chunk_is_captured_and_stripped_when_the_engine_asked_for_it(upstream, make_proxy):
    service = RecordingService(strip_usage_chunk=True)
    proxy = await make_proxy(upstream.url, context=service)
    stream = await async_client(proxy.url).chat.completions.create(model="echo", messages=MESSAGES, stream=True)
    chunks = [c async for c in stream]
    assert all(c.choices for c in chunks), "the usage-only chunk reached the client"
    assert orjson.loads(upstream.last.body)["stream_options"] == {"include_usage": True}
    assert service.turns[0].usages == [USAGE]


async def test_usage_chunk_the_client_asked_for_is_kept(upstream, make_proxy):
    service = RecordingService(strip_usage_chunk=False)
    proxy = await make_proxy(upstream.url, context=service)
    stream = await async_client(proxy.url).chat.completions.create(
        model="echo", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == USAGE["total_tokens"]
    assert service.turns[0].usages == [USAGE]


async def test_context_overflow_is_refitted_and_retried_once(upstream, make_proxy):
    service = RecordingService()
    proxy = await make_proxy(upstream.url, context=service)
    answer = await async_client(proxy.url).chat.completions.create(model="overflow", messages=MESSAGES)
    assert answer.choices[0].message.content == "Hello from the fake upstream"
    assert service.turns[0].refits == [5000]
    assert upstream.overflow_refused == 1 and orjson.loads(upstream.last.body)["refitted"] is True


async def test_context_overflow_passes_through_when_the_engine_cannot_refit(upstream, make_proxy):
    proxy = await make_proxy(upstream.url, context=RecordingService(refit=False))
    with pytest.raises(openai.BadRequestError) as caught:
        await async_client(proxy.url).chat.completions.create(model="overflow", messages=MESSAGES)
    assert caught.value.code == "context_length_exceeded"
    assert "resulted in 5000 tokens" in caught.value.message


async def test_engine_rejection_is_a_local_error_in_openai_shape(upstream, make_proxy):
    service = RecordingService(fail_with=Rejected(400, "too long for the window", "context_length_exceeded"))
    proxy = await make_proxy(upstream.url, context=service)
    with pytest.raises(openai.BadRequestError) as caught:
        await async_client(proxy.url).chat.completions.create(model="echo", messages=MESSAGES)
    assert caught.value.code == "context_length_exceeded"
    assert upstream.seen == []


async def test_an_engine_bug_forwards_the_request_unchanged(upstream, make_proxy):
    proxy = await make_proxy(upstream.url, context=RecordingService(fail_with=RuntimeError("bug")))
    answer = await async_client(proxy.url).chat.completions.create(model="echo", messages=MESSAGES)
    assert answer.choices[0].message.content
    assert orjson.loads(upstream.last.body)["messages"] == MESSAGES


async def test_client_authorization_passes_through_without_a_configured_key(upstream, proxy):
    await async_client(proxy.url, key="sk-client-own").chat.completions.create(model="echo", messages=MESSAGES)
    assert upstream.last.headers["Authorization"] == "Bearer sk-client-own"


async def test_configured_key_replaces_the_clients(upstream, make_proxy, monkeypatch):
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", "sk-upstream-secret")
    proxy = await make_proxy(upstream.url, api_key_env="FAKE_UPSTREAM_KEY")
    client = async_client(proxy.url, key="sk-client-should-not-leave")
    await client.chat.completions.create(model="echo", messages=MESSAGES)
    await client.models.list()
    for seen in upstream.seen:
        assert seen.headers["Authorization"] == "Bearer sk-upstream-secret"
        assert "sk-client-should-not-leave" not in str(seen.headers)


async def test_a_missing_configured_key_never_falls_back_to_the_clients(upstream, make_proxy, monkeypatch):
    monkeypatch.delenv("FAKE_UPSTREAM_KEY", raising=False)
    proxy = await make_proxy(upstream.url, api_key_env="FAKE_UPSTREAM_KEY")
    with pytest.raises(openai.APIStatusError) as caught:
        await async_client(proxy.url).chat.completions.create(model="echo", messages=MESSAGES)
    assert caught.value.status_code == 502 and upstream.seen == []
