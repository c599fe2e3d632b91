"""How the simulator's bytes leave: recorded streams replayed, bodies re-cut into pieces, extra headers,
request bodies counted as they arrive, and every client that leaves early counted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from proxy.demo.simulator import SIMULATOR, SimulatorConfig, start_simulator
from tests.harness import chat_body, settle

SSE_DIR = Path(__file__).parent / "data" / "sse"
RECORDED = (SSE_DIR / "test_parse_nothing__e2aad469b71d.sse").read_bytes()


@pytest.fixture
async def sim():
    config = SimulatorConfig(recorded_streams={"nothing": RECORDED}, extra_headers={"Keep-Alive": "timeout=5"})
    runner, url = await start_simulator(config)
    yield runner.app[SIMULATOR], url
    await runner.cleanup()


async def raw_post(url: str, headers: dict[str, str], body: bytes) -> tuple[bytes, list[bytes]]:
    """POST over a bare socket: (response head, the body's HTTP chunks as the server wrote them)."""
    host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
    writer.write(f"{head}{lines}\r\n".encode() + body)
    reply = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head_bytes, rest = reply.split(b"\r\n\r\n", 1)
    chunks = []
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return head_bytes, chunks
        chunks.append(rest[:size])
        rest = rest[size + 2 :]


async def test_a_recorded_stream_is_replayed_byte_for_byte_in_the_piece_sizes_asked_for(sim):
    state, url = sim
    body = json.dumps(chat_body(stream=True)).encode()
    head, chunks = await raw_post(url, {"X-Sim-Recorded": "nothing", "X-Sim-Piece-Bytes": "1,7,64"}, body)
    assert b"text/event-stream" in head
    assert b"".join(chunks) == RECORDED
    assert [len(c) for c in chunks[:-1]] == [(1, 7, 64)[i % 3] for i in range(len(chunks) - 1)]
    assert state.totals.answered == 1


async def test_without_piece_sizes_a_recorded_stream_goes_out_event_by_event(sim):
    _, url = sim
    _, chunks = await raw_post(url, {"X-Sim-Recorded": "nothing"}, json.dumps(chat_body(stream=True)).encode())
    assert b"".join(chunks) == RECORDED
    assert all(c.endswith(b"\n\n") and c.count(b"\n\n") == 1 for c in chunks)


@pytest.mark.parametrize(
    ("headers", "fragment"),
    [({"X-Sim-Recorded": "everything"}, "known: ['nothing']"), ({"X-Sim-Piece-Bytes": "3,0"}, "positive integers")],
)
async def test_a_bad_delivery_header_is_a_400_not_a_silent_success(sim, headers, fragment):
    _, url = sim
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/chat/completions", json=chat_body(), headers=headers) as resp,
    ):
        assert resp.status == 400 and fragment in (await resp.json())["error"]["message"]


async def test_extra_headers_go_on_every_response(sim):
    _, url = sim
    async with aiohttp.ClientSession() as http:
        for method, path in (("POST", "/chat/completions"), ("GET", "/models"), ("GET", "/nowhere")):
            async with http.request(method, url + path, json=chat_body()) as resp:
                assert resp.headers["Keep-Alive"] == "timeout=5", (method, path)


async def test_request_bodies_are_counted_as_they_arrive(sim):
    state, url = sim

    async def body():
        yield b'{"model": "sim-32k", '
        assert await settle(lambda: state.body_bytes >= 21, timeout=5), "the first piece was not read on arrival"
        yield b'"messages": [{"role": "user", "content": "hi"}]}'

    async with aiohttp.ClientSession() as http, http.post(f"{url}/chat/completions", data=body()) as resp:
        assert resp.status == 200
    assert state.requests[-1].body["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("fault", ["silence", "slow-headers"])
async def test_a_client_that_leaves_before_the_headers_is_counted(sim, fault):
    state, url = sim
    state.config.slow_headers_s = 5
    timeout = aiohttp.ClientTimeout(total=0.2)
    with pytest.raises(asyncio.TimeoutError):
        async with aiohttp.ClientSession(timeout=timeout) as http:
            await http.post(f"{url}/chat/completions", json=chat_body(), headers={"X-Sim-Fault": fault})
    assert await settle(lambda: state.totals.disconnects == 1)
