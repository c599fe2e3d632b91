"""`python -m bench state`: what shared state costs, and what a second worker buys on this machine.

1. Per turn, Redis state vs in-memory: the packaged traces replayed turn by turn through two
   `context-proxy serve` processes (one in-memory, one on a real `redis-server`), each turn sent
   to both in turn so drift in the machine's load hits both alike. Added ms = the per-turn
   difference of whole streamed requests; bytes written = what Redis received (INFO
   total_net_input_bytes) per turn, protocol included.
2. `--workers 2` vs 1 (both on Redis), in one run: C concurrent agents, each replaying the
   first turns of a trace in its own session, as fast as answers come. Throughput, and the
   CPU seconds per request of the proxy (all its processes), the simulator, Redis and the
   client, read from /proc, so the table says what the machine spent where.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis

from bench.procs import Server, spawn
from bench.stats import median, percentile, table
from proxy.demo.traces import list_traces, load_trace, requests
from tests.harness import closed_port
from tests.redis_server import RedisServer

MODEL = "sim-32k"
CONFIG = """
[upstream]
base_url = "{upstream}"

[models."sim-*"]
context_window = 32000
encoding = "o200k_base"
input_per_mtok = 2.50
cached_input_per_mtok = 1.25

[server]
max_connections = 4096
"""
_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and of its children still running (a --workers parent and its workers)."""
    total = 0.0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICKS
    return total


class Proxy:
    """`context-proxy serve` in its own process(es), from a config written for it."""

    def __init__(self, folder: Path, upstream: str, redis_url: str = "", workers: int = 1) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "proxy.toml"
        text = CONFIG.format(upstream=upstream)
        config.write_text(text + (f'\n[state]\nredis_url = "{redis_url}"\n' if redis_url else ""))
        self.port = closed_port()
        args = ["serve", "--config", str(config), "--port", str(self.port), "--log-level", "WARNING"]
        self.proc = subprocess.Popen([sys.executable, "-m", "proxy", *args, "--workers", str(workers)])

    async def ready(self) -> None:
        async with aiohttp.ClientSession() as client:
            for _ in range(600):
                try:
                    async with client.get(f"http://127.0.0.1:{self.port}/healthz") as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
        raise RuntimeError("proxy did not start")

    def cpu_seconds(self) -> float:
        return _cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _turn_bodies(turns: int | None, tag: str = "", names: list[str] | None = None) -> list[tuple[str, bytes]]:
    """(session, body) of every packaged trace's turns (the first `turns` of each), trace after trace.

    `tag` is appended to every message's text, so agents replaying one trace share no cached count.
    """
    out = []
    for name in names or list_traces():
        trace = load_trace(name)
        for k, (messages, _answer) in enumerate(requests(trace)):
            if turns is not None and k == turns:
                break
            if tag:
                messages = [{**m, "content": f"{m['content']} {tag}"} if m.get("content") else m for m in messages]
            body = {"model": MODEL, "messages": messages, "stream": True}
            if trace.tools:
                body["tools"] = trace.tools
            out.append((f"bench-{name}", orjson.dumps(body)))
    return out


async def _send(client: aiohttp.ClientSession, port: int, session: str, body: bytes) -> float:
    """One streamed turn, read to its end; its wall time in ms."""
    started = time.perf_counter()
    url = f"http://127.0.0.1:{port}/s/{session}/v1/chat/completions"
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
    async with client.post(url, data=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        await response.read()
    return (time.perf_counter() - started) * 1000


def _redis_input_bytes(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("stats")["total_net_input_bytes"])
    finally:
        client.close()


async def _per_turn(sim: Server, folder: Path, redis_server: RedisServer, turns: int | None) -> dict[str, Any]:
    memory = Proxy(folder / "memory", sim.url)
    shared = Proxy(folder / "redis", sim.url, redis_server.url)
    try:
        await memory.ready()
        await shared.ready()
        bodies = _turn_bodies(turns)
        before = _redis_input_bytes(redis_server.url)
        times: dict[str, list[float]] = {"memory": [], "redis": []}
        async with aiohttp.ClientSession() as client:
            for k, (session, body) in enumerate(bodies):
                order = [("memory", memory), ("redis", shared)][:: 1 if k % 2 else -1]
                for name, proxy in order:
                    times[name].append(await _send(client, proxy.port, session, body))
        written = _redis_input_bytes(redis_server.url) - before
    finally:
        memory.stop()
        shared.stop()
    added = [r - m for r, m in zip(times["redis"], times["memory"], strict=True)]
    return {
        "turns": len(bodies),
        "memory_p50_ms": median(times["memory"]),
        "redis_p50_ms": median(times["redis"]),
        "added_p50_ms": median(added),
        "added_p90_ms": percentile(added, 90),
        "redis_bytes_per_turn": written / len(bodies),
        "request_bytes_per_turn": sum(len(b) for _, b in bodies) / len(bodies),
    }


async def _agent(client: aiohttp.ClientSession, port: int, session: str, bodies: list[bytes]) -> int:
    for body in bodies:
        await _send(client, port, session, body)
    return len(bodies)


async def _load(port: int, agents: int, turns: int, keepalive: bool) -> tuple[int, float]:
    """`agents` concurrent sessions, each replaying the first `turns` turns of a trace; (requests, seconds).

    keepalive: each agent keeps its connection (as SDKs do), so the kernel keeps it on one worker;
    else a new connection per turn, so consecutive turns of a session land on either worker.
    """
    first = list_traces()[:1]
    bodies = [[body for _, body in _turn_bodies(turns, f"[agent {i}]", first)] for i in range(agents)]

    async def agent(i: int) -> int:
        connector = aiohttp.TCPConnector(limit=1, force_close=not keepalive)
        async with aiohttp.ClientSession(connector=connector) as client:
            return await _agent(client, port, f"agent-{i}", bodies[i])

    started = time.perf_counter()
    done = await asyncio.gather(*(agent(i) for i in range(agents)))
    return sum(done), time.perf_counter() - started


async def _workers(sim: Server, folder: Path, redis_server: RedisServer, agents: int, turns: int) -> list[dict]:
    rows = []
    for workers, keepalive in ((1, True), (2, True), (1, False), (2, False)):
        redis_server.stop()
        redis_server.start()  # each run starts from an empty store
        proxy = Proxy(folder / f"workers-{workers}", sim.url, redis_server.url, workers=workers)
        try:
            await proxy.ready()
            await asyncio.sleep(1.0)  # every worker listening
            await _load(proxy.port, 4 * workers, 2, keepalive=False)  # warm up: each worker loads its encoding
            redis_pid = redis_server.process.pid if redis_server.process else 0
            marks = (proxy.cpu_seconds(), sim.cpu_seconds(), _cpu_seconds(redis_pid), time.process_time())
            count, seconds = await _load(proxy.port, agents, turns, keepalive)
            spent = (
                proxy.cpu_seconds() - marks[0],
                sim.cpu_seconds() - marks[1],
                _cpu_seconds(redis_pid) - marks[2],
                time.process_time() - marks[3],
            )
        finally:
            proxy.stop()
        rows.append(
            {
                "workers": workers,
                "connections": "one per agent" if keepalive else "new per turn",
                "requests": count,
                "seconds": seconds,
                "throughput_rps": count / seconds,
                "proxy_cpu_ms_per_request": spent[0] / count * 1000,
                "sim_cpu_ms_per_request": spent[1] / count * 1000,
                "redis_cpu_ms_per_request": spent[2] / count * 1000,
                "client_cpu_ms_per_request": spent[3] / count * 1000,
                "machine_cores_busy": sum(spent) / seconds,
            }
        )
    return rows


async def _run(turns: int | None, agents: int, load_turns: int) -> dict[str, Any]:
    sim = spawn("sim", "--chunks", "4")
    with tempfile.TemporaryDirectory(prefix="bench-state-") as tmp:
        folder = Path(tmp)
        redis_server = RedisServer(folder)
        redis_server.start()
        try:
            per_turn = await _per_turn(sim, folder, redis_server, turns)
            workers = await _workers(sim, folder, redis_server, agents, load_turns)
        finally:
            redis_server.stop()
            sim.stop()
    load = os.getloadavg()
    return {"per_turn": per_turn, "workers": workers, "loadavg_1m": load[0], "cores": os.cpu_count()}


def run_state(turns: int | None = None, agents: int = 16, load_turns: int = 30) -> dict[str, Any]:
    return asyncio.run(_run(turns, agents, load_turns))


def render(result: dict[str, Any]) -> str:
    p = result["per_turn"]
    lines = [
        f"Per turn, {p['turns']} turns of the packaged traces, each sent to both proxies in turn:",
        table(
            ["", "in-memory", "Redis", "added (p50 / p90 of per-turn differences)"],
            [
                [
                    "whole streamed turn, p50 ms",
                    f"{p['memory_p50_ms']:.2f}",
                    f"{p['redis_p50_ms']:.2f}",
                    f"{p['added_p50_ms']:+.2f} / {p['added_p90_ms']:+.2f}",
                ]
            ],
        ),
        f"Redis received {p['redis_bytes_per_turn']:,.0f} bytes per turn "
        f"(the client sent {p['request_bytes_per_turn']:,.0f} bytes per turn).",
        "",
        f"--workers 1 vs 2 on Redis ({result['cores']} cores; load average {result['loadavg_1m']:.1f} at the end):",
        table(
            ["workers", "connections", "requests", "req/s", "proxy CPU ms/req", "sim", "redis", "client", "cores busy"],
            [
                [
                    r["workers"],
                    r["connections"],
                    r["requests"],
                    f"{r['throughput_rps']:.1f}",
                    f"{r['proxy_cpu_ms_per_request']:.2f}",
                    f"{r['sim_cpu_ms_per_request']:.2f}",
                    f"{r['redis_cpu_ms_per_request']:.2f}",
                    f"{r['client_cpu_ms_per_request']:.2f}",
                    f"{r['machine_cores_busy']:.2f}",
                ]
                for r in result["workers"]
            ],
        ),
    ]
    return "\n".join(lines)
