"""An upstream that misbehaves on demand (the simulator's X-Sim-Fault): the right status, nothing leaked.

After each fault: the event loop is back to its task count, no upstream connection is left
checked out of the proxy's pool, and the proxy still answers.
"""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest

from proxy.demo.simulator import BAD_GATEWAY, SimulatorConfig
from tests.harness import ENGINES, Rig, chat_body, closed_port, is_openai_error, settle, start_rig

READ_TIMEOUT_S = 0.6
_VOLATILE = re.compile(rb'"(id|created)":("[^"]*"|\d+)')


@pytest.fixture(params=ENGINES)
async def rig(request):
    sim = SimulatorConfig(slow_headers_s=0.3, fault_after_chunks=3)
    rig = await start_rig(sim_config=sim, engine=request.param, upstream={"read_timeout_s": READ_TIMEOUT_S})
    await fetch(rig.base_url, chat_body())  # the pool's one idle upstream connection is part of the baseline
    yield rig
    await rig.close()


async def fetch(url: str, body: dict, fault: str = "", session_id: str = "s-faults") -> tuple[int, bytes, bool]:
    """(status, body bytes received, whether the body ended cleanly)."""
    headers = {"X-Sim-Fault": fault, "X-Session-Id": session_id} if fault else {"X-Session-Id": session_id}
    received = bytearray()
    timeout = aiohttp.ClientTimeout(total=15)
    async with (
        aiohttp.ClientSession(timeout=timeout) as client,
        client.post(url + "/chat/completions", json=body, headers=headers) as response,
    ):
        try:
            async for chunk in response.content.iter_any():
                received += chunk
        except aiohttp.ClientPayloadError:
            return response.status, bytes(received), False
        return response.status, bytes(received), True


async def assert_nothing_leaked(rig: Rig, tasks_before: int) -> None:
    assert await settle(lambda: rig.upstream_in_use() == 0), "an upstream connection stayed checked out"
    assert await settle(lambda: len(asyncio.all_tasks()) <= tasks_before), [t.get_coro() for t in asyncio.all_tasks()]
    status, _, clean = await fetch(rig.base_url, chat_body())
    assert (status, clean) == (200, True)


async def test_connection_refused_is_a_502() -> None:
    rig = await start_rig(upstream_url=f"http://127.0.0.1:{closed_port()}/v1")
    try:
        async with (
            aiohttp.ClientSession() as client,
            client.post(rig.base_url + "/chat/completions", json=chat_body()) as response,
        ):
            assert response.status == 502
            assert is_openai_error(await response.json())
    finally:
        await rig.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_reset_before_headers_is_a_502(rig: Rig, stream: bool) -> None:
    tasks = len(asyncio.all_tasks())
    status, data, _ = await fetch(rig.base_url, chat_body(stream=stream), "reset-before-headers")
    assert status == 502
    assert b'"upstream' in data
    await assert_nothing_leaked(rig, tasks)


async def test_reset_mid_stream_ends_the_stream_without_done(rig: Rig) -> None:
    tasks = len(asyncio.all_tasks())
    status, data, clean = await fetch(rig.base_url, chat_body(stream=True), "reset-mid-stream")
    assert status == 200
    assert b"data: " in data and b"[DONE]" not in data
    assert not clean, "a broken stream must not end like a complete one"
    await assert_nothing_leaked(rig, tasks)


async def test_silence_before_headers_is_a_504(rig: Rig) -> None:
    tasks = len(asyncio.all_tasks())
    started = asyncio.get_running_loop().time()
    status, _, _ = await fetch(rig.base_url, chat_body(stream=True), "silence")
    assert status == 504
    assert asyncio.get_running_loop().time() - started < READ_TIMEOUT_S + 2
    await assert_nothing_leaked(rig, tasks)


async def test_silence_mid_stream_ends_the_stream_after_the_read_timeout(rig: Rig) -> None:
    tasks = len(asyncio.all_tasks())
    started = asyncio.get_running_loop().time()
    status, data, clean = await fetch(rig.base_url, chat_body(stream=True), "silence-mid-stream")
    assert status == 200
    assert b"data: " in data and b"[DONE]" not in data and not clean
    assert asyncio.get_running_loop().time() - started < READ_TIMEOUT_S + 2
    await assert_nothing_leaked(rig, tasks)


def _normalised(data: bytes) -> bytes:
    return _VOLATILE.sub(rb'"\1":_', data)


async def test_malformed_sse_is_passed_through_untouched(rig: Rig) -> None:
    tasks = len(asyncio.all_tasks())
    headers = {"X-Sim-Fault": "malformed-sse"}
    async with (
        aiohttp.ClientSession() as client,
        client.post(rig.sim_url + "/chat/completions", json=chat_body(stream=True), headers=headers) as r,
    ):
        direct = await r.read()
    status, proxied, _ = await fetch(rig.base_url, chat_body(stream=True), "malformed-sse")
    assert status == 200
    assert _normalised(proxied) == _normalised(direct)
    await assert_nothing_leaked(rig, tasks)


async def test_non_json_error_is_passed_through_untouched(rig: Rig) -> None:
    tasks = len(asyncio.all_tasks())
    async with aiohttp.ClientSession() as client:
        headers = {"X-Sim-Fault": "non-json-error"}
        async with client.post(rig.base_url + "/chat/completions", json=chat_body(), headers=headers) as response:
            assert response.status == 502
            assert response.content_type == "text/html"
            assert await response.text() == BAD_GATEWAY
    await assert_nothing_leaked(rig, tasks)


@pytest.mark.parametrize("fault,status", [("status-401", 401), ("status-429", 429), ("status-500", 500)])
async def test_upstream_errors_keep_their_status_and_body(rig: Rig, fault: str, status: int) -> None:
    got, data, clean = await fetch(rig.base_url, chat_body(stream=True), fault)
    assert (got, clean) == (status, True)
    assert is_openai_error(json.loads(data))


async def test_slow_headers_still_answer(rig: Rig) -> None:
    tasks = len(asyncio.all_tasks())
    status, data, clean = await fetch(rig.base_url, chat_body(stream=True), "slow-headers")
    assert (status, clean) == (200, True)
    assert data.rstrip().endswith(b"data: [DONE]")
    await assert_nothing_leaked(rig, tasks)


async def test_sessions_survive_every_fault() -> None:
    rig = await start_rig(
        sim_config=SimulatorConfig(fault_after_chunks=3), engine=True, upstream={"read_timeout_s": READ_TIMEOUT_S}
    )
    try:
        status, _, _ = await fetch(rig.base_url, chat_body(stream=True), session_id="s-keep")
        assert status == 200
        before = await rig.context.session_json("s-keep")
        for fault in ("reset-before-headers", "reset-mid-stream", "malformed-sse", "non-json-error", "status-500"):
            await fetch(rig.base_url, chat_body(stream=True), fault, session_id="s-other")
        assert await rig.context.session_json("s-keep") == before
        status, _, clean = await fetch(rig.base_url, chat_body(stream=True), session_id="s-keep")
        assert (status, clean) == (200, True)
        assert (await rig.context.session_json("s-keep"))["turns"] == before["turns"] + 1
    finally:
        await rig.close()
