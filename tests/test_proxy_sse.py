"""Recorded OpenAI streams relayed byte for byte, and the SSE usage filter on its own."""

from __future__ import annotations

import aiohttp
import openai
import orjson
import pytest

from proxy.dialects.chat import overflow_tokens
from proxy.shell.relay import SseUsageFilter
from tests.conftest import RECORDED_STREAMS, SSE_DIR, RecordingService

RECORDINGS = sorted(RECORDED_STREAMS)
MESSAGES = [{"role": "user", "content": "hi"}]
ODD_PIECES = "1,7,13,64,3,211,2,997"  # bytes: events straddle the proxy's reads
PACED = {"X-Sim-Piece-Bytes": ODD_PIECES, "X-Sim-Delay-Ms": "0.05"}  # a pause between pieces, so reads see them apart


def replaying(name: str) -> dict[str, str]:
    return {"X-Sim-Recorded": name, **PACED}


def usage_event(data: bytes) -> bytes:
    events = data.split(b"\n\n")
    return next(e for e in events if b'"choices":[]' in e and b'"usage":{' in e) + b"\n\n"


async def post_stream(base_url: str, name: str) -> tuple[bytes, dict]:
    body = {"model": "gpt-4o", "messages": MESSAGES, "stream": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base_url}/chat/completions", json=body, headers=replaying(name)) as response,
    ):
        assert response.status == 200
        return await response.read(), dict(response.headers)


@pytest.mark.parametrize("name", RECORDINGS)
async def test_recorded_streams_reach_the_client_byte_for_byte(rig, name):
    received, headers = await post_stream(rig.base_url, name)
    assert received == (SSE_DIR / name).read_bytes()
    assert headers["Content-Type"].startswith("text/event-stream")


@pytest.mark.parametrize("name", RECORDINGS)
async def test_recorded_streams_parse_in_the_sdk(rig, name):
    client = openai.AsyncOpenAI(base_url=rig.base_url, api_key="sk-client", max_retries=0, timeout=10)
    stream = await client.chat.completions.create(
        model="gpt-4o", messages=MESSAGES, stream=True, extra_headers=replaying(name)
    )
    chunks = [c async for c in stream]
    assert len(chunks) == (SSE_DIR / name).read_bytes().count(b"data: {")
    assert chunks[-1].usage is not None


@pytest.mark.parametrize("name", RECORDINGS[:4])
async def test_recorded_usage_chunk_is_stripped_exactly(make_rig, name):
    service = RecordingService(strip_usage_chunk=True)
    rig = await make_rig(context=service)
    received, _ = await post_stream(rig.base_url, name)
    recorded = (SSE_DIR / name).read_bytes()
    assert received == recorded.replace(usage_event(recorded), b"")
    assert received.endswith(b"data: [DONE]\n\n")
    usage = orjson.loads(usage_event(recorded).removeprefix(b"data: "))["usage"]
    assert service.turns[0].usages == [usage]


def feed_in_pieces(sse: SseUsageFilter, data: bytes, size: int) -> bytes:
    out = b"".join(sse.feed(data[i : i + size]) for i in range(0, len(data), size))
    return out + sse.finish()


@pytest.mark.parametrize("size", [1, 2, 5, 17, 4096])
def test_the_filter_keeps_every_byte_when_not_stripping(size):
    data = (SSE_DIR / RECORDINGS[0]).read_bytes()
    sse = SseUsageFilter(strip_usage_chunk=False)
    assert feed_in_pieces(sse, data, size) == data
    assert sse.usage["total_tokens"] == orjson.loads(usage_event(data).removeprefix(b"data: "))["usage"]["total_tokens"]


@pytest.mark.parametrize("size", [3, 1 << 20])  # small reads, and the whole stream in one read
@pytest.mark.parametrize("separator", [b"\n\n", b"\r\n\r\n"])
def test_the_filter_strips_only_the_usage_only_event(separator, size):
    events = [
        b'data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}',
        b'data: {"choices":[],"usage":{"prompt_tokens":3}}',
        b"data: [DONE]",
    ]
    data = separator.join(events) + separator
    sse = SseUsageFilter(strip_usage_chunk=True)
    assert feed_in_pieces(sse, data, size) == events[0] + separator + events[2] + separator
    assert sse.usage == {"prompt_tokens": 3}


@pytest.mark.parametrize("separator", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_the_filter_reads_whole_event_chunks_as_the_upstream_sends_them(separator):
    """One read per event (the usual case): chunks with `"usage": null` pass whole, the usage object is read."""
    events = [
        b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}',
        b'data: {"choices":[{"delta":{"content":"\\"usage\\": {"}}], "usage": null}',
        b'data: {"choices":[], "usage" : {"prompt_tokens":5}}',
        b"data: [DONE]",
    ]
    chunks = [e + separator for e in events]
    for strip in (False, True):
        sse = SseUsageFilter(strip_usage_chunk=strip)
        out = b"".join(sse.feed(c) for c in chunks) + sse.finish()
        assert out == b"".join(chunks[i] for i in range(4) if not (strip and i == 2))
        assert sse.usage == {"prompt_tokens": 5}


def test_the_filter_keeps_a_usage_chunk_that_also_has_choices():
    data = b'data: {"choices":[{"delta":{}}],"usage":{"prompt_tokens":3}}\n\n'
    sse = SseUsageFilter(strip_usage_chunk=True)
    assert feed_in_pieces(sse, data, 7) == data and sse.usage == {"prompt_tokens": 3}


def test_the_filter_passes_malformed_events_untouched():
    data = b'data: {"usage": {broken\n\ndata: [DONE]\n\n: comment\n\nunterminated'
    assert feed_in_pieces(SseUsageFilter(strip_usage_chunk=True), data, 4) == data


@pytest.mark.parametrize(
    ("message", "tokens"),
    [
        ("This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.", 9000),
        (
            "maximum context length is 8192 tokens, however you requested 9100 tokens (9000 in the messages, 100 in",
            9000,
        ),
        ("Input tokens exceed the configured limit", None),
    ],
)
def test_overflow_tokens_are_read_from_the_upstream_message(message, tokens):
    body = orjson.dumps({"error": {"message": message, "code": "context_length_exceeded"}})
    assert overflow_tokens(body) == tokens
    assert overflow_tokens(b"<html>502</html>") is None
