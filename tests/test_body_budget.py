"""Request bodies held in memory share one budget: past it a request gets 503 with Retry-After, never more memory."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import orjson
import pytest

from tests.harness import chat_body, start_rig

MB = 1024 * 1024


@pytest.fixture(params=[False, True], ids=["passthrough", "engine"])
async def rig(request):
    rig = await start_rig(engine=request.param, server={"body_budget_mb": 3, "max_body_mb": 2})
    yield rig
    await rig.close()


def _padded_body(size: int) -> bytes:
    body = orjson.dumps(chat_body("hello", user="x"))
    return body[:-1] + b', "metadata": {"pad": "' + b"p" * (size - len(body) - 24) + b'"}}'


async def test_a_body_past_the_budget_gets_503_with_retry_after_until_the_budget_frees(rig) -> None:
    held = _padded_body(2 * MB - 1000)  # reserves 2 of the 3 MB while it trickles in
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(held)}\r\n\r\n"
    slow = await asyncio.to_thread(socket.create_connection, ("127.0.0.1", rig.port), 20)
    try:
        await asyncio.to_thread(slow.sendall, head.encode() + held[: MB // 2])
        await asyncio.sleep(0.3)  # the proxy has started reading it
        second = _padded_body(2 * MB - 1000)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as client:
            url = f"{rig.base_url}/chat/completions"
            headers = {"Content-Type": "application/json"}
            async with client.post(url, data=second, headers=headers) as refused:
                assert refused.status == 503
                assert refused.headers["Retry-After"] == "1"
                assert (await refused.json())["error"]["code"] == "server_busy"
            await asyncio.to_thread(slow.sendall, held[MB // 2 :])
            answer = await asyncio.to_thread(slow.recv, 65536)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
            async with client.post(url, data=second, headers=headers) as retried:
                assert retried.status == 200
    finally:
        slow.close()
