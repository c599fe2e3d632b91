"""Slow, idle and too many clients against a real proxy over raw sockets: each is closed or refused, never held.

The timeouts are set to a second here (the defaults are 60 s); every wait below is bounded, and a
connection the proxy never closes fails the test at its bound instead of hanging it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from tests.harness import start_rig

BOUND_S = 20  # how long a test waits for the proxy to act (it should within about a second)


@pytest.fixture
async def rig():
    rig = await start_rig(
        server={"header_timeout_s": 1, "body_timeout_s": 1, "keepalive_timeout_s": 1, "max_connections": 4}
    )
    yield rig
    await rig.close()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND_S)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the proxy sends until it closes; a socket timeout (the proxy kept it open) fails the test."""
    received = b""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"still open after {BOUND_S} s: {received[:200]!r}")


def _trickle_until_closed(sock: socket.socket, lines: int) -> bool:
    """Send one header line every 0.2 s; True when the proxy closed the connection before the head was done."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    sock.settimeout(0.2)
    for i in range(lines):
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            pass
        except ConnectionResetError:  # closed with unsent data in its buffer: a reset, still a close
            return True
        try:
            sock.sendall(f"X-Slow-{i}: 1\r\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            return True
    return False


async def test_a_connection_that_sends_nothing_is_closed(rig) -> None:
    with _connect(rig.port) as sock:
        assert await asyncio.to_thread(_read_until_closed, sock) == b""


async def test_an_idle_keep_alive_connection_is_closed_after_its_answer(rig) -> None:
    with _connect(rig.port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.to_thread(_read_until_closed, sock)
    assert answer.startswith(b"HTTP/1.1 200")


async def test_a_head_trickled_a_line_at_a_time_is_closed(rig) -> None:
    with _connect(rig.port) as sock:
        assert await asyncio.to_thread(_trickle_until_closed, sock, BOUND_S * 5)


def _post_head(path: str) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n".encode()


async def test_a_stalled_body_gets_408_in_openai_shape_and_the_connection_closes(rig) -> None:
    head = _post_head("/v1/chat/completions")
    with _connect(rig.port) as sock:
        sock.sendall(head + b'{"model": "gpt-4o", "mess')
        answer = await asyncio.to_thread(_read_until_closed, sock)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408")
    assert json.loads(body)["error"]["code"] == "request_timeout"


async def test_a_stalled_body_on_a_passthrough_route_gets_408(rig) -> None:
    head = _post_head("/v1/embeddings")
    with _connect(rig.port) as sock:
        sock.sendall(head + b'{"input": "')
        answer = await asyncio.to_thread(_read_until_closed, sock)
    assert answer.startswith(b"HTTP/1.1 408")


async def test_past_max_connections_a_new_connection_gets_503_and_the_proxy_recovers(rig) -> None:
    held = [_connect(rig.port) for _ in range(4)]
    try:
        for sock in held:  # each admitted: it answers
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await asyncio.to_thread(sock.recv, 65536)).startswith(b"HTTP/1.1 200")
        with _connect(rig.port) as extra:
            answer = await asyncio.to_thread(_read_until_closed, extra)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
        assert json.loads(body)["error"]["code"] == "too_many_connections"
    finally:
        for sock in held:
            sock.close()
    await asyncio.sleep(0.2)  # the proxy sees the closes
    with _connect(rig.port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await asyncio.to_thread(_read_until_closed, sock)).startswith(b"HTTP/1.1 200")
