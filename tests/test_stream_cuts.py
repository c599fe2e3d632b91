"""A cut stream is an error the client sees, never a silent half answer (proxy/shell/stream_ends.py).

A real aiohttp upstream replays recorded chat streams and written Responses and Messages
streams (tests/data), cutting each where the test says: after 0, 1 or n whole events, or in
the middle of one; by a clean end of the body, a connection closed mid-body, or a reset.
The official SDKs read through the proxy: every cut raises, every whole stream arrives byte
for byte and raises nothing. The cut points are drawn from a seeded RNG (the seed is in the id).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp import web

from proxy.metrics import METRICS
from proxy.shell.stream_ends import STREAM_APIS
from tests.conftest import RECORDED_STREAMS
from tests.harness import Rig
from tests.streams import STREAMS, end_index, rig_before, split_events

PATHS = {"chat": "chat/completions", "responses": "responses", "messages": "messages"}
HOW = ("eof", "close", "reset")  # a clean end of the body; the connection closed mid-body; a TCP reset
WHERE = ("0", "1", "n", "mid")  # after 0, 1, n whole events; inside an event


@dataclass(frozen=True)
class Cut:
    after: int  # whole events sent
    partial: int  # then this many bytes of the next one
    how: str

    @property
    def header(self) -> str:
        return f"{self.after},{self.partial},{self.how}"


async def replay(request: web.Request) -> web.StreamResponse:
    """The upstream: the stream named by X-Stream, cut as X-Cut says (whole when absent)."""
    await request.read()
    api = next(a for a, p in PATHS.items() if request.path == f"/v1/{p}")
    events = split_events(STREAMS[api][request.headers["X-Stream"]])
    after, partial, how = request.headers.get("X-Cut", f"{len(events)},0,eof").split(",")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await response.prepare(request)
    for event in events[: int(after)]:
        await response.write(event)
    if int(partial):
        await response.write(events[int(after)][: int(partial)])
    transport = request.transport
    assert transport is not None
    if how == "silence":  # until the proxy gives up (its read timeout) and hangs up
        while not transport.is_closing():
            await asyncio.sleep(0.05)
    elif how == "close":
        transport.close()  # what was written goes out, then FIN without the body's last chunk
    elif how == "reset":
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    return response


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    rig = await rig_before(replay)
    yield rig
    await rig.close()


# -- the official SDKs, one way of reading a stream each ------------------------------------------------------------


def _openai(rig: Rig) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=rig.base_url, api_key="sk-test", max_retries=0, timeout=15)


def _anthropic(rig: Rig) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=rig.root, api_key="sk-ant-test", max_retries=0, timeout=15)


async def chat_create(rig: Rig, headers: dict) -> Any:
    stream = await _openai(rig).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True, extra_headers=headers
    )
    return [chunk async for chunk in stream]


async def responses_create(rig: Rig, headers: dict) -> Any:
    stream = await _openai(rig).responses.create(model="gpt-4.1", input="hi", stream=True, extra_headers=headers)
    return [event async for event in stream]


async def responses_stream(rig: Rig, headers: dict) -> Any:
    async with _openai(rig).responses.stream(model="gpt-4.1", input="hi", extra_headers=headers) as stream:
        async for _ in stream:
            pass
        return await stream.get_final_response()


MESSAGES_REQUEST = {
    "model": "claude-sonnet-4-20250514",
    "max_tokens": 1024,
    "messages": [{"role": "user", "content": "hi"}],
}


async def messages_create(rig: Rig, headers: dict) -> Any:
    stream = await _anthropic(rig).messages.create(**MESSAGES_REQUEST, stream=True, extra_headers=headers)
    return [event async for event in stream]


async def messages_stream(rig: Rig, headers: dict) -> Any:
    async with _anthropic(rig).messages.stream(**MESSAGES_REQUEST, extra_headers=headers) as stream:
        async for _ in stream:
            pass
        return await stream.get_final_message()


RAW_REQUESTS = {
    "chat": {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": True},
    "responses": {"model": "gpt-4.1", "input": "hi", "stream": True},
    "messages": {**MESSAGES_REQUEST, "stream": True},
}
READERS: dict[str, list[Callable[[Rig, dict], Awaitable[Any]]]] = {
    "chat": [chat_create],
    "responses": [responses_create, responses_stream],
    "messages": [messages_create, messages_stream],
}
SDK_ERRORS = (openai.APIError, anthropic.APIError)


async def post_raw(rig: Rig, api: str, headers: dict) -> tuple[int, bytes, bool]:
    """(status, body bytes, whether the body ended cleanly), read with a plain HTTP client."""
    received = bytearray()
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http,
        http.post(f"{rig.base_url}/{PATHS[api]}", json=RAW_REQUESTS[api], headers=headers) as response,
    ):
        try:
            async for chunk in response.content.iter_any():
                received += chunk
        except aiohttp.ClientPayloadError:
            return response.status, bytes(received), False
        return response.status, bytes(received), True


def cut_count(api: str, cause: str) -> float:
    return METRICS.counter("context_proxy_streams_cut_total", "", ["api", "cause"]).value(api=api, cause=cause)


# -- whole streams ------------------------------------------------------------------------------------------------

WHOLE = [(api, name) for api, streams in STREAMS.items() for name in streams]


@pytest.mark.parametrize(("api", "name"), WHOLE, ids=[f"{a}-{n[:32]}" for a, n in WHOLE])
async def test_a_whole_stream_arrives_byte_for_byte_and_raises_nothing(rig: Rig, api: str, name: str) -> None:
    before = sum(cut_count(api, cause) for cause in ("eof", "reset", "timeout"))
    status, received, clean = await post_raw(rig, api, {"X-Stream": name})
    assert (status, clean) == (200, True)
    assert received == STREAMS[api][name]
    for read in READERS[api]:
        assert await read(rig, {"X-Stream": name})
    assert sum(cut_count(api, cause) for cause in ("eof", "reset", "timeout")) == before


@pytest.mark.parametrize("how", ["eof", "close"])  # (a reset may lose the finish_reason still in flight)
@pytest.mark.parametrize("name", sorted(RECORDED_STREAMS)[:4])
async def test_a_chat_stream_that_ends_after_finish_reason_is_whole(rig: Rig, name: str, how: str) -> None:
    """No `[DONE]` (nor the usage chunk) after the finish_reason: the answer is complete, nothing is added."""
    events = split_events(RECORDED_STREAMS[name])
    after = end_index("chat", events) + 1
    headers = {"X-Stream": name, "X-Cut": Cut(after, 0, how).header}
    status, received, clean = await post_raw(rig, "chat", headers)
    assert status == 200 and clean
    assert received == b"".join(events[:after])
    assert await chat_create(rig, headers)


# -- cut streams --------------------------------------------------------------------------------------------------

CASES = [(api, where, how) for api in STREAMS for where in WHERE for how in HOW]


def draw_cut(api: str, where: str, how: str) -> tuple[str, list[bytes], Cut]:
    """A stream and a cut point before its end marker, drawn from a seed named by the case."""
    rng = random.Random(f"{api}-{where}-{how}")
    name = rng.choice(sorted(STREAMS[api]))
    events = split_events(STREAMS[api][name])
    last = end_index(api, events)  # events before the marker: 0 .. last-1
    if where == "mid":
        after = rng.randint(1, last)  # inside an event, up to the marker's own
        return name, events, Cut(after, rng.randint(1, len(events[after]) - 2), how)
    after = {"0": 0, "1": 1, "n": rng.randint(2, last)}[where]
    return name, events, Cut(after, 0, how)


def the_error_event(api: str, tail: bytes) -> dict:
    """`tail` is exactly one SSE event in the API's error form; its payload."""
    assert tail.endswith(b"\n\n") and tail.count(b"\n\n") == 1, tail
    lines = tail.strip().split(b"\n")
    if api == "chat":
        assert len(lines) == 1 and lines[0].startswith(b"data: ")
        payload = orjson.loads(lines[0][6:])
        assert payload["error"]["message"] and payload["error"]["code"]
        return payload
    assert lines[0] == b"event: error" and len(lines) == 2
    payload = orjson.loads(lines[1].removeprefix(b"data: "))
    assert payload["type"] == "error"
    if api == "responses":
        assert payload["message"] and isinstance(payload["sequence_number"], int) and payload["error"]["message"]
    else:
        assert payload["error"]["type"] == "api_error" and payload["error"]["message"]
    return payload


@pytest.mark.parametrize(("api", "where", "how"), CASES, ids=["-".join(c) for c in CASES])
async def test_a_cut_stream_gets_one_error_event_after_the_bytes_relayed(
    rig: Rig, api: str, where: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    name, events, cut = draw_cut(api, where, how)
    headers = {"X-Stream": name, "X-Cut": cut.header}
    cause = "eof" if how == "eof" else "reset"
    counted = cut_count(api, cause)
    with caplog.at_level(logging.WARNING, logger="proxy.relay"):
        status, received, clean = await post_raw(rig, api, headers)
    assert cut_count(api, cause) == counted + 1, cut
    cut_lines = [r.getMessage() for r in caplog.records if "stream cut" in r.getMessage()]
    assert len(cut_lines) == 1 and f"({cause})" in cut_lines[0]
    assert not any(e.split(b"data: ", 1)[-1][:40].decode() in cut_lines[0] for e in events)  # no content logged
    if status == 502:  # nothing reached the proxy before the cut: an error response, as before any byte
        assert cut.after == 0 or how == "reset", cut
        assert orjson.loads(received)["error"]["message"]  # OpenAI's error shape, or Anthropic's on its own route
        return
    assert status == 200 and not clean, cut
    whole = [e for e in events[: cut.after]]
    relayed = next(i for i in range(len(whole), -1, -1) if received.startswith(b"".join(whole[:i])))
    assert relayed == cut.after or how == "reset", (cut, relayed)  # a reset may lose what was still in flight
    the_error_event(api, received[len(b"".join(whole[:relayed])) :])
    if api == "responses" and relayed:
        sequence = orjson.loads(whole[relayed - 1].split(b"data: ", 1)[1])["sequence_number"]
        assert the_error_event(api, received[len(b"".join(whole[:relayed])) :])["sequence_number"] == sequence + 1


@pytest.mark.parametrize(("api", "where", "how"), CASES, ids=["-".join(c) for c in CASES])
async def test_every_sdk_raises_on_a_cut_stream(rig: Rig, api: str, where: str, how: str) -> None:
    name, _, cut = draw_cut(api, where, how)
    headers = {"X-Stream": name, "X-Cut": cut.header}
    for read in READERS[api]:
        with pytest.raises(SDK_ERRORS) as raised:
            await read(rig, headers)
        error = raised.value
        if isinstance(error, openai.APIStatusError | anthropic.APIStatusError) and error.status_code == 502:
            assert cut.after == 0 or how == "reset", (read.__name__, cut)
            continue
        assert "cut short" in str(error), (read.__name__, cut, error)


def test_every_api_the_proxy_rewrites_or_relays_has_its_end_marker() -> None:
    assert set(STREAM_APIS) == set(STREAMS) == set(PATHS)


@pytest.mark.parametrize("api", list(STREAMS))
async def test_an_upstream_gone_silent_mid_stream_gets_the_timeout_error(api: str) -> None:
    rig = await rig_before(replay, upstream={"read_timeout_s": 0.5})
    try:
        name, events, cut = draw_cut(api, "n", "silence")
        headers = {"X-Stream": name, "X-Cut": cut.header}
        counted = cut_count(api, "timeout")
        status, received, clean = await post_raw(rig, api, headers)
        assert status == 200 and not clean
        relayed = b"".join(events[: cut.after])
        assert received.startswith(relayed)
        error = the_error_event(api, received[len(relayed) :])
        assert "stopped sending" in orjson.dumps(error).decode()
        assert cut_count(api, "timeout") == counted + 1
        for read in READERS[api]:
            with pytest.raises(SDK_ERRORS, match="cut short"):
                await read(rig, headers)
    finally:
        await rig.close()
