"""What the proxy adds to every request, next to the simulator direct and the bare relay (bench/relay.py).

Servers run in their own processes (bench/serve.py); the load comes from one aiohttp client
in this process. Concurrency 1 alternates A/B/C request by request (the order rotating each
round); concurrency 16 alternates blocks of requests, so each target's throughput is its own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.procs import Server, Servers
from bench.stats import median, percentile, table
from proxy.demo.traces import load_trace, requests

TARGETS = ("direct", "relay", "proxy")
STREAM_CHUNKS = (16, 32, 64)  # content chunks per streamed answer, cycled request by request
BODY_TRACE, BODY_TURN = "sweagent_marshmallow-1867.json", 3  # an agent's 4th request: 8 messages, tools, ~22 KB


def request_body(stream: bool, model: str = "gpt-4o") -> bytes:
    trace = load_trace(BODY_TRACE)
    messages, _ = list(requests(trace))[BODY_TURN]
    return orjson.dumps({"model": model, "messages": messages, "tools": trace.tools, "stream": stream})


@dataclass
class Sample:
    total_ms: float
    first_ms: float  # first body bytes (for a stream: its first event)
    events: int  # SSE events received (blank-line terminated)
    expected: int  # events the simulator sent: role, content pieces, finish, [DONE]
    reads: int  # separate reads that brought bytes


async def send(client: aiohttp.ClientSession, url: str, body: bytes, chunks: int) -> Sample:
    headers = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json", "X-Sim-Chunks": str(chunks)}
    started = time.perf_counter()
    first = 0.0
    data = bytearray()
    reads = 0
    async with client.post(url + "/chat/completions", data=body, headers=headers) as response:
        async for piece in response.content.iter_any():
            if not first:
                first = time.perf_counter()
            reads += 1
            data += piece
        status = response.status
    done = time.perf_counter()
    if status != 200:
        raise RuntimeError(f"{url}: HTTP {status}: {bytes(data[:300])!r}")
    return Sample((done - started) * 1e3, (first - started) * 1e3, data.count(b"\n\n"), chunks + 3, reads)


@dataclass
class TargetRun:
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0  # wall time of this target's blocks (concurrency > 1)
    cpu_s: float = 0.0  # CPU time of the target's own process (relay, proxy)
    sim_cpu_s: float = 0.0  # the simulator's CPU time during this target's blocks (concurrency > 1)
    client_cpu_s: float = 0.0  # this (client) process's CPU time during this target's blocks (concurrency > 1)

    def summary(self, stream: bool) -> dict[str, float]:
        totals = [s.total_ms for s in self.samples]
        firsts = [s.first_ms for s in self.samples]
        n = len(self.samples)
        return {
            "n": n,
            "p50_ms": median(totals),
            "p99_ms": percentile(totals, 99),
            "first_p50_ms": median(firsts),
            "rps": n / self.seconds if self.seconds else 1e3 / median(totals),
            "cpu_ms_per_req": self.cpu_s * 1e3 / n if n else 0.0,
            "events_ok": all(s.events == s.expected for s in self.samples) if stream else True,
            "sim_cpu_ms_per_req": self.sim_cpu_s * 1e3 / n if n else 0.0,
            "client_cpu_ms_per_req": self.client_cpu_s * 1e3 / n if n else 0.0,
            # cores kept busy by client + simulator + the target's own process (2 on this machine = saturated)
            "cores_busy": (self.client_cpu_s + self.sim_cpu_s + self.cpu_s) / self.seconds if self.seconds else 0.0,
        }


async def _serial(client: aiohttp.ClientSession, urls: dict[str, str], body: bytes, n: int) -> dict[str, TargetRun]:
    runs = {t: TargetRun() for t in TARGETS}
    for i in range(n):
        order = TARGETS[i % 3 :] + TARGETS[: i % 3]
        for target in order:
            runs[target].samples.append(await send(client, urls[target], body, STREAM_CHUNKS[i % 3]))
    return runs


async def _block(client: aiohttp.ClientSession, url: str, body: bytes, n: int, concurrency: int) -> list[Sample]:
    samples: list[Sample] = []
    counter = iter(range(n))

    async def worker() -> None:
        for i in counter:
            samples.append(await send(client, url, body, STREAM_CHUNKS[i % 3]))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


async def _blocks(
    client: aiohttp.ClientSession,
    urls: dict[str, str],
    body: bytes,
    n: int,
    concurrency: int,
    rounds: int,
    sim: Server | None = None,
    processes: dict[str, Server] | None = None,
) -> dict[str, TargetRun]:
    """Blocks of `n // rounds` requests per target, the targets' order rotating each round.

    `processes`: the server behind each target, whose CPU time each of its blocks adds to `cpu_s`.
    """
    names = list(urls)
    runs = {t: TargetRun() for t in names}
    per_block = max(concurrency, n // rounds)
    for r in range(rounds):
        for target in names[r % len(names) :] + names[: r % len(names)]:
            process = (processes or {}).get(target)
            own_before = process.cpu_seconds() if process else 0.0
            sim_before = sim.cpu_seconds() if sim else 0.0
            client_before = time.process_time()
            started = time.perf_counter()
            runs[target].samples += await _block(client, urls[target], body, per_block, concurrency)
            runs[target].seconds += time.perf_counter() - started
            runs[target].client_cpu_s += time.process_time() - client_before
            runs[target].sim_cpu_s += (sim.cpu_seconds() - sim_before) if sim else 0.0
            runs[target].cpu_s += (process.cpu_seconds() - own_before) if process else 0.0
    return runs


async def _mode(
    servers: Servers, client: aiohttp.ClientSession, stream: bool, concurrency: int, n: int, rounds: int
) -> dict[str, Any]:
    urls = {"direct": servers.sim.url, "relay": servers.relay.url, "proxy": servers.proxy.url}
    processes: dict[str, Server] = {"relay": servers.relay, "proxy": servers.proxy}
    body = request_body(stream)
    for target in TARGETS:  # warm up connections, the proxy's session and caches
        await _block(client, urls[target], body, max(4, concurrency), concurrency)
    cpu_before = {t: p.cpu_seconds() for t, p in processes.items()}
    if concurrency == 1:
        runs = await _serial(client, urls, body, n)
    else:
        runs = await _blocks(client, urls, body, n, concurrency, rounds, servers.sim)
    for t, p in processes.items():
        runs[t].cpu_s = p.cpu_seconds() - cpu_before[t]
    out = {t: runs[t].summary(stream) for t in TARGETS}
    return {"stream": stream, "concurrency": concurrency, "body_bytes": len(body), "targets": out, **_verdict(out)}


def _verdict(out: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Added latency vs direct, the proxy against the relay, and the issue's targets."""
    direct, relay, proxy = out["direct"], out["relay"], out["proxy"]
    added = {
        t: {
            "p50_ms": out[t]["p50_ms"] - direct["p50_ms"],
            "p99_ms": out[t]["p99_ms"] - direct["p99_ms"],
            "first_ms": out[t]["first_p50_ms"] - direct["first_p50_ms"],
        }
        for t in ("relay", "proxy")
    }
    throughput_ratio = proxy["rps"] / relay["rps"]
    return {
        "added": added,
        "added_p50_ratio": added["proxy"]["p50_ms"] / added["relay"]["p50_ms"] if added["relay"]["p50_ms"] else None,
        "throughput_vs_relay": throughput_ratio,
        "throughput_vs_direct": proxy["rps"] / direct["rps"],
        "cpu_vs_relay": proxy["cpu_ms_per_req"] / relay["cpu_ms_per_req"] if relay["cpu_ms_per_req"] else None,
        "meets_latency": added["proxy"]["p50_ms"] <= 2 * max(0.0, added["relay"]["p50_ms"]) + 0.2,
        "meets_throughput": throughput_ratio >= 0.8,
    }


async def forwarding_check(servers: Servers, chunks: int = 32, delay_ms: int = 3) -> dict[str, Any]:
    """A paced stream through each target: every event arrives, and each in its own read (none held back)."""
    body = request_body(True)
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession() as client:
        for target, server in (("direct", servers.sim), ("relay", servers.relay), ("proxy", servers.proxy)):
            headers = {"Authorization": "Bearer sk-bench", "X-Sim-Chunks": str(chunks), "X-Sim-Delay-Ms": str(delay_ms)}
            arrivals: list[float] = []
            data = bytearray()
            started = time.perf_counter()
            async with client.post(server.url + "/chat/completions", data=body, headers=headers) as response:
                async for piece in response.content.iter_any():
                    arrivals.append(time.perf_counter() - started)
                    data += piece
            events = data.count(b"\n\n")
            out[target] = {"events": events, "sent": chunks + 3, "reads": len(arrivals), "last_ms": arrivals[-1] * 1e3}
    out["one_for_one"] = all(out[t]["events"] == chunks + 3 for t in TARGETS)
    out["none_held_back"] = out["proxy"]["reads"] >= out["direct"]["reads"] - 1
    return out


async def run_overhead(
    n: int = 300,
    n_concurrent: int = 1200,
    concurrency: int = 16,
    rounds: int = 4,
    servers: Servers | None = None,
) -> dict[str, Any]:
    """Every mode: non-streaming and streaming at concurrency 1 and `concurrency`, plus the forwarding check."""
    own = servers is None
    servers = servers or Servers()
    try:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector) as client:
            modes = []
            for stream in (False, True):
                modes.append(await _mode(servers, client, stream, 1, n, rounds))
                modes.append(await _mode(servers, client, stream, concurrency, n_concurrent, rounds))
        check = await forwarding_check(servers)
        return {"engine": servers.proxy.engine, "modes": modes, "forwarding": check}
    finally:
        if own:
            servers.close()


def render(result: dict[str, Any]) -> str:
    rows = []
    for m in result["modes"]:
        t, a = m["targets"], m["added"]
        rows.append(
            [
                "stream" if m["stream"] else "json",
                m["concurrency"],
                t["direct"]["p50_ms"],
                a["relay"]["p50_ms"],
                a["proxy"]["p50_ms"],
                a["relay"]["p99_ms"],
                a["proxy"]["p99_ms"],
                a["relay"]["first_ms"],
                a["proxy"]["first_ms"],
                t["relay"]["rps"],
                t["proxy"]["rps"],
                m["throughput_vs_relay"],
                m["cpu_vs_relay"],
                "yes" if m["meets_latency"] and m["meets_throughput"] else "NO",
            ]
        )
    header = [
        "mode", "conc", "direct p50 ms", "relay +p50", "proxy +p50", "relay +p99", "proxy +p99",
        "relay +1st", "proxy +1st", "relay req/s", "proxy req/s", "thru proxy/relay", "CPU proxy/relay", "targets",
    ]  # fmt: skip
    cpu_rows = []
    for m in result["modes"]:
        if m["concurrency"] == 1:
            continue
        for t in TARGETS:
            c = m["targets"][t]
            parts = [c.get("client_cpu_ms_per_req", 0.0), c.get("sim_cpu_ms_per_req", 0.0), c["cpu_ms_per_req"]]
            kind = "stream" if m["stream"] else "json"
            cpu_rows.append([kind, m["concurrency"], t, *parts, sum(parts), c.get("cores_busy", 0.0)])
    cpu_header = ["mode", "conc", "target", "client CPU ms/req", "sim CPU ms/req", "own CPU ms/req", "total"]
    cpu_header.append("cores busy")
    f = result["forwarding"]
    lines = [
        f"engine: {result['engine']}; body {result['modes'][0]['body_bytes']:,} bytes (json), added = vs direct",
        table(header, rows),
        "",
        "CPU per request at concurrency > 1 (client = this process, one aiohttp client; own = relay or proxy):",
        table(cpu_header, cpu_rows),
        "",
        "forwarding check (32 chunks, 3 ms apart): "
        + ", ".join(f"{t} {f[t]['events']}/{f[t]['sent']} events in {f[t]['reads']} reads" for t in TARGETS)
        + f"; one for one: {f['one_for_one']}, none held back: {f['none_held_back']}",
    ]
    return "\n".join(lines)
