"""`context-proxy serve --workers N`: N processes on one port that serve every conversation as one proxy would."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.demo.simulator import SIMULATOR, start_simulator
from tests.harness import closed_port
from tests.redis_server import REDIS_SERVER, RedisServer
from tests.test_state_redis import ask, redis_server, reference, turns, wait_healthy, write_config

__all__ = ["redis_server", "reference"]  # fixtures this module uses


def serve_command(config: Path, port: int, workers: int) -> list[str]:
    args = ["--config", str(config), "--port", str(port), "--workers", str(workers), "--log-level", "WARNING"]
    return [sys.executable, "-m", "proxy", "serve", *args]


def test_more_than_one_worker_without_shared_state_is_refused_in_one_line(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")  # no [state] redis_url
    run = subprocess.run(serve_command(config, closed_port(), 2), capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "--workers 2" in lines[0] and "redis_url" in lines[0], run.stderr


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed (.ci/run installs it)")
async def test_two_workers_on_one_port_send_what_one_proxy_sends(
    tmp_path: Path, redis_server: RedisServer, reference: list[bytes]
) -> None:
    sim, url = await start_simulator()
    port = closed_port()
    parent = subprocess.Popen(serve_command(write_config(tmp_path / "workers", url, redis_server.url), port, 2))
    try:
        await wait_healthy(port)
        for session, _k, messages, tools in turns():
            await ask(port, session, messages, tools)  # a new connection each turn: the kernel picks the worker
        sent = [r.raw for r in sim.app[SIMULATOR].requests]
    finally:
        parent.send_signal(signal.SIGTERM)
        code = parent.wait(timeout=30)
        await sim.cleanup()
    assert code == 0
    assert sent == reference
