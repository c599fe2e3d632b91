"""One upstream SSE event of tens of MB on the chat route: relayed whole, in linear work and flat memory.

The event is read in one pass and, past the 4 MiB bound (proxy/shell/sse_framing.py), relayed as it comes
without being kept or parsed; what follows it (the finish_reason, the usage chunk) is read as
usual. `python -m bench long-event` gives the time against passthrough.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import orjson
import pytest

from bench.long_event import END, FIRST, HEAD, TAIL, WRITE, answer_size, long_answer
from tests.conftest import RecordingService
from tests.harness import Rig
from tests.streams import rig_before

BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Write a lot."}], "stream": True}


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    rig = await rig_before(long_answer, context=RecordingService())
    yield rig
    await rig.close()


async def read_all(rig: Rig, headers: dict) -> tuple[int, int, bytes, bytes, bool]:
    """(status, length, sha256, last bytes, clean end) of the chat answer, read without keeping it."""
    digest, length, last, clean = hashlib.sha256(), 0, b"", True
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
        http.post(f"{rig.base_url}/chat/completions", json=BODY, headers=headers) as response,
    ):
        try:
            async for chunk in response.content.iter_any():
                digest.update(chunk)
                length += len(chunk)
                last = (last + chunk)[-4096:]
        except aiohttp.ClientPayloadError:
            clean = False
        return response.status, length, digest.digest(), last, clean


def sent(mb: int) -> bytes:
    digest = hashlib.sha256(FIRST + HEAD)
    for _ in range(mb * 1024 * 1024 // WRITE):
        digest.update(b"a" * WRITE)
    digest.update(TAIL + END)
    return digest.digest()


async def test_a_48_mb_event_on_the_chat_route_arrives_whole_in_flat_memory(rig: Rig) -> None:
    peak, baseline = 0, rss_bytes()

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, rss_bytes())
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    try:
        async with asyncio.timeout(120):
            status, length, digest, last, clean = await read_all(rig, {"X-Long-MB": "48"})
    finally:
        sampler.cancel()
    assert (status, clean, length) == (200, True, answer_size(48))
    assert digest == sent(48) and last.endswith(TAIL + END)
    # The event never sits in memory: holding it would take 48 MB (the code before this held it twice).
    assert peak - baseline < 24 * 2**20, (peak - baseline) / 2**20
    # What follows the long event is read as usual: its usage chunk reached the turn.
    assert rig.context.turns[0].usages == [{"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}]


async def test_a_stream_cut_inside_a_long_event_ends_that_event_then_sends_the_error(rig: Rig) -> None:
    """The long event's start is already out: it is ended (a client discards it as broken), then the error event."""
    headers = {"X-Long-MB": "6", "X-Long-Cut": "1"}
    status, length, _, last, clean = await read_all(rig, headers)
    assert status == 200 and not clean
    head, error = last.rsplit(b"\n\n", 2)[-3:-1]
    assert head.endswith(b"a" * 64) and length > 6 * 2**20
    assert orjson.loads(error.removeprefix(b"data: "))["error"]["code"] == "upstream_broken"
    client = openai.AsyncOpenAI(base_url=rig.base_url, api_key="sk-test", max_retries=0, timeout=60)
    with pytest.raises(Exception):  # noqa: B017 - the SDK fails on the broken event before it reaches the error
        stream = await client.chat.completions.create(**BODY, extra_headers=headers)
        async for _ in stream:
            pass
