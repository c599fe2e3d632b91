"""`context-proxy serve --workers N`: N processes on one port that serve every conversation as one proxy would."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from proxy.demo.simulator import SIMULATOR, start_simulator
from tests.harness import closed_port, settle
from tests.redis_server import REDIS_SERVER, RedisServer
from tests.test_state_redis import ask, reference, turns, wait_healthy, write_config

__all__ = ["reference"]  # a fixture this module uses (redis_server is conftest's)


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


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def _requests_served(port: int) -> float:
    """`context_proxy_requests_total` for chat completions, as the worker this connection reached says."""
    async with aiohttp.ClientSession() as client, client.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    assert "process_cpu_seconds_total" not in text  # one worker's own: a shared registry leaves them out
    # Every status: a client that hangs up as soon as it has read its answer may be counted as 499.
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(CHAT_REQUESTS))


CHAT_REQUESTS = 'context_proxy_requests_total{route="chat_completions",'


async def _reads(port: int, served: int) -> bool:
    return await _requests_served(port) == served


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed (.ci/run installs it)")
async def test_every_worker_answers_metrics_for_all_of_them_and_a_restarted_one_takes_nothing_away(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    sim, url = await start_simulator()
    port, served = closed_port(), 40
    parent = subprocess.Popen(serve_command(write_config(tmp_path / "metrics", url, redis_server.url), port, 2))
    body = {"model": "sim-12k", "messages": [{"role": "user", "content": "hi"}]}
    try:
        await wait_healthy(port)
        for i in range(served):  # a new connection each: the kernel spreads them over both workers
            async with (
                aiohttp.ClientSession() as client,
                client.post(f"http://127.0.0.1:{port}/s/m-{i}/v1/chat/completions", json=body) as response,
            ):
                assert response.status == 200
        # The worker that sent the last answer counts it once its handler returns; by then the client may already
        # be scraping the other worker (on a loaded machine it read 39 of 40).
        await settle(lambda: _reads(port, served), timeout=10.0, step=0.05)
        scrapes = [await _requests_served(port) for _ in range(10)]  # each on a new connection, either worker
        assert scrapes == [served] * 10
        workers = _children(parent.pid)
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        for _ in range(200):  # the parent starts another
            if len(set(_children(parent.pid)) - set(workers)) == 1:
                break
            await asyncio.sleep(0.05)
        await wait_healthy(port)
        assert [await _requests_served(port) for _ in range(10)] == [served] * 10
    finally:
        parent.send_signal(signal.SIGTERM)
        code = parent.wait(timeout=30)
        await sim.cleanup()
    assert code == 0


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_workers_die_with_a_sigkilled_parent_and_the_port_is_free_again(tmp_path: Path) -> None:
    """SIGKILL leaves the parent no chance to pass a signal on: the workers must notice by themselves, or they go
    on serving and a new instance starts beside them on the same port."""
    sim, url = await start_simulator()
    port = closed_port()
    config = write_config(tmp_path / "orphans", url)
    command = [*serve_command(config, port, 2), "--passthrough"]  # passthrough: no shared state needed
    parent = subprocess.Popen(command)
    workers: list[int] = []
    try:
        await wait_healthy(port)
        workers = _children(parent.pid)
        assert len(workers) == 2
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        for _ in range(300):
            if not any(_alive(pid) for pid in workers):
                break
            await asyncio.sleep(0.05)
        assert not [pid for pid in workers if _alive(pid)], "workers kept serving after their parent died"
        with pytest.raises(aiohttp.ClientConnectionError):
            async with aiohttp.ClientSession() as client, client.get(f"http://127.0.0.1:{port}/healthz"):
                pass
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        await sim.cleanup()
