"""`python -m bench slow-clients`: with the default config, how long the proxy keeps a client that goes quiet.

Four clients at once, on raw sockets: one sends nothing, one trickles a header line every 5 s, one
stops mid-body, one stays idle after its answer. Each is timed until the proxy closes it (~60 s).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from bench.procs import spawn

BOUND_S = 200


def _until_closed(sock: socket.socket) -> float:
    started = time.monotonic()
    while sock.recv(65536):
        pass
    return time.monotonic() - started


def _silent(port: int) -> dict[str, Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S) as sock:
        return {"closed_after_s": _until_closed(sock)}


def _trickled_head(port: int) -> dict[str, Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        started, lines = time.monotonic(), 0
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        while time.monotonic() - started < BOUND_S:
            try:
                if sock.recv(65536) == b"":
                    break
            except TimeoutError:
                pass
            try:
                sock.sendall(f"X-Slow-{lines}: 1\r\n".encode())
                lines += 1
            except OSError:
                break
        return {"closed_after_s": time.monotonic() - started, "header_lines_sent": lines}


def _stalled_body(port: int) -> dict[str, Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        started = time.monotonic()
        answer = sock.recv(65536)
        answered = time.monotonic() - started
        return {
            "answer": answer.split(b"\r\n")[0].decode(),
            "answered_after_s": answered,
            "closed_after_s": answered + _until_closed(sock),
        }


def _idle_keep_alive(port: int) -> dict[str, Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.recv(65536)
        return {"closed_after_s": _until_closed(sock)}


def run_slow_clients() -> dict[str, Any]:
    sim = spawn("sim")
    proxy = spawn("proxy", "--upstream", sim.url)
    results: dict[str, Any] = {}
    probes = {
        "silent connection": _silent,
        "head trickled every 5 s": _trickled_head,
        "body stalled": _stalled_body,
        "idle keep-alive": _idle_keep_alive,
    }

    def probe(name: str) -> None:
        results[name] = probes[name](proxy.port)

    try:
        threads = [threading.Thread(target=probe, args=(name,)) for name in probes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(BOUND_S)
    finally:
        proxy.stop()
        sim.stop()
    return results


def render(results: dict[str, Any]) -> str:
    lines = ["client (default config)          closed after"]
    for name, row in results.items():
        extra = f"  ({row['answer']} after {row['answered_after_s']:.1f} s)" if "answer" in row else ""
        lines.append(f"{name:<32} {row['closed_after_s']:6.1f} s{extra}")
    return "\n".join(lines)
