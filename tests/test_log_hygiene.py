"""What a hostile client can make `context-proxy serve` write to its log: no forged lines, no keys, no flood.

The proxy runs as a user runs it (a child process, the CLI's logging) at DEBUG, the most it ever writes.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import pytest

from tests.served import serve, write_config

FORGED = "2026-12-01 05:00:00,000 INFO proxy.shell.access: 10.0.0.1 GET /admin 200 0.001s"
SECRET = "sk-hostile-secret-4242"
BOUND_S = 20


def _exchange(port: int, raw: bytes) -> bytes:
    """Send raw bytes, read until the proxy closes or stops answering."""
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S) as sock:
        sock.sendall(raw)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return received


@pytest.fixture
def proxy(tmp_path: Path):
    served = serve(write_config(tmp_path), upstream_url="http://127.0.0.1:9/v1", log_level="DEBUG")
    yield served
    served.stop()


def test_a_path_with_a_line_break_cannot_forge_a_log_line(proxy) -> None:
    path = "/v1/x%0a" + FORGED.replace(" ", "%20")
    answer = _exchange(proxy.port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 ")
    log = proxy.stop()
    assert "/v1/x\\n2026-12-01" in log  # the request is logged, its line break escaped
    assert not any(line.startswith(FORGED) for line in log.splitlines())


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {SECRET}\x01".encode(), f"Bearer {SECRET}".encode() + b"a" * 9000],
    ids=["control-character", "past-8190-bytes"],
)
def test_a_malformed_authorization_header_never_reaches_the_log(proxy, authorization: bytes) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: " + authorization + b"\r\n"
    answer = _exchange(proxy.port, head + b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")
    assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request")  # refused by the HTTP parser
    log = proxy.stop()
    assert "Error handling request" in log  # aiohttp did log it, without the header
    assert SECRET not in log


def test_running_out_of_descriptors_logs_a_line_per_interval_not_per_connection(tmp_path: Path) -> None:
    proxy = serve(write_config(tmp_path), upstream_url="http://127.0.0.1:9/v1", max_files=64)
    held = []
    try:
        for _ in range(200):  # past the limit: the listener keeps failing to accept
            sock = socket.socket()
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect(("127.0.0.1", proxy.port))
            held.append(sock)
        time.sleep(2)
    finally:
        for sock in held:
            sock.close()
    time.sleep(1.5)  # the proxy accepts again once descriptors are free
    answer = _exchange(proxy.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    log = proxy.stop()
    assert answer.startswith(b"HTTP/1.1 200")
    assert "out of file descriptors" in log
    assert log.count("Too many open files") <= 3, log[:3000]
    assert "Traceback" not in log.split("config reload failed")[0]  # no traceback per refused connection
