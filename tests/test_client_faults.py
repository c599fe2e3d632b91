"""Clients that hang up, read slowly or hold idle connections: the proxy cancels, pushes back and keeps serving."""

from __future__ import annotations

import asyncio
import resource

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.demo.simulator import SimulatorConfig
from proxy.tokens.counter import counter_for
from tests.harness import ENGINES, Rig, chat_body, settle, start_rig


@pytest.fixture(params=ENGINES)
async def rig(request):
    rig = await start_rig(sim_config=SimulatorConfig(chunks=400, chunk_delay_s=0.02), engine=request.param)
    yield rig
    await rig.close()


async def test_client_disconnect_cancels_the_upstream_request_within_100ms(rig: Rig) -> None:
    tasks = len(asyncio.all_tasks())
    reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
    body = orjson.dumps(chat_body(stream=True))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    await writer.drain()
    received = b""
    while received.count(b"data: ") < 3:
        received += await asyncio.wait_for(reader.read(65536), 5)
    assert rig.sim.active_streams == 1
    writer.transport.abort()  # the client is gone: no FIN handshake, just gone
    loop = asyncio.get_running_loop()
    hung_up = loop.time()
    assert await settle(lambda: rig.sim.active_streams == 0, timeout=2, step=0.002)
    assert loop.time() - hung_up < 0.1, f"upstream stream outlived its client by {loop.time() - hung_up:.3f}s"
    assert rig.sim.totals.disconnects == 1
    assert await settle(lambda: rig.upstream_in_use() == 0)
    assert await settle(lambda: len(asyncio.all_tasks()) <= tasks)


# ---- a slow reader against a 50 MB stream ------------------------------------------------------

STREAM_BYTES = 50 * 1024 * 1024
EVENT = b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 16_000}}]}) + b"\n\n"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


async def _start_firehose() -> tuple[web.AppRunner, str, dict]:
    """An upstream that streams 50 MB of SSE, generated as it goes, counting what it has handed to its socket."""
    counters = {"sent": 0}

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        while counters["sent"] < STREAM_BYTES:
            await response.write(EVENT)  # write() waits for the transport to drain: backpressure reaches us
            counters["sent"] += len(EVENT)
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1", counters


@pytest.mark.parametrize("engine", ENGINES)
async def test_slow_reader_pushes_back_instead_of_buffering_50mb(engine: bool) -> None:
    upstream, url, counters = await _start_firehose()
    rig = await start_rig(upstream_url=url, engine=engine)
    rig.extra.append(upstream)
    counter_for("o200k_base").count_text("warm up")  # the engine's tokenizer tables are not what we measure
    rss_before, gaps, received = _rss_bytes(), [], 0
    try:
        timeout = aiohttp.ClientTimeout(total=60)
        async with (
            aiohttp.ClientSession(timeout=timeout) as client,
            client.post(rig.base_url + "/chat/completions", json=chat_body(stream=True)) as response,
        ):
            assert response.status == 200
            for _ in range(150):  # 3 s at ~3 MB/s: far slower than the upstream can send
                received += len(await response.content.read(64 * 1024))
                gaps.append(counters["sent"] - received)
                await asyncio.sleep(0.02)
            rss_slow = _rss_bytes()
            while chunk := await response.content.read(1024 * 1024):
                received += len(chunk)
        assert received == counters["sent"] + len(b"data: [DONE]\n\n")
    finally:
        await rig.close()
    assert counters["sent"] >= STREAM_BYTES
    # What is in flight is what the kernel's socket buffers hold (tcp_rmem allows MBs): it must stop growing.
    first, second = max(gaps[:75]), max(gaps[75:])
    assert second < first + 2 * 1024 * 1024, f"in flight kept growing: {first / 2**20:.1f} -> {second / 2**20:.1f} MB"
    assert second < STREAM_BYTES / 2
    assert rss_slow - rss_before < 40 * 1024 * 1024, f"RSS grew {(rss_slow - rss_before) / 2**20:.1f} MB"


# ---- idle connections --------------------------------------------------------------------------


async def test_many_idle_keep_alive_connections_do_not_starve_real_requests(rig: Rig) -> None:
    idle: list[asyncio.StreamWriter] = []
    try:
        for i in range(300):
            reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
            if i % 3 == 0:  # a slowloris: headers begun, never finished
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
            else:  # one answered keep-alive request, then silence
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
                assert b" 200 " in await asyncio.wait_for(reader.readline(), 5)
            idle.append(writer)
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with (
            aiohttp.ClientSession() as client,
            client.post(rig.base_url + "/chat/completions", json=chat_body()) as response,
        ):
            assert response.status == 200
            await response.read()
        assert loop.time() - started < 2
    finally:
        for writer in idle:
            writer.close()
    assert await settle(lambda: len(rig.proxy_runner.server.connections) == 0, timeout=3)
