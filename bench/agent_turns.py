"""CPU per request on agent turns: sessions that grow turn by turn, the proxy against the bare relay.

`bench overhead` sends one body again and again (to the proxy, nearly every request is a retry of the
last turn); here each of `concurrency` clients plays whole agent runs (the packaged traces, each its own
session by `X-Session-Id`), one request after the other as the agent sent them, so every proxied request
is a new turn: its new messages counted, deduplicated or compacted, the agent's message read for recall
and reach, the epoch check run. The relay and the proxy take the same runs in alternating blocks; CPU per
request is each server process's own (/proc), as in `bench overhead`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import aiohttp
import orjson

from bench.overhead import STREAM_CHUNKS
from bench.procs import Server, Servers
from bench.stats import median, table
from proxy.demo.traces import list_traces, load_trace, requests

MODEL = "gpt-4.1"  # a 1M window: no run reaches it sent whole, so the relay's requests never fail
TARGETS = ("relay", "proxy")


def runs(stream: bool) -> list[list[bytes]]:
    """Each packaged trace's requests, as the agent sent them, serialised once (the client's CPU is not measured)."""
    out = []
    for name in list_traces():
        trace = load_trace(name)
        out.append(
            [
                orjson.dumps({"model": MODEL, "messages": messages, "tools": trace.tools, "stream": stream})
                for messages, _ in requests(trace)
            ]
        )
    return out


async def _play(client: aiohttp.ClientSession, url: str, session: str, bodies: list[bytes], stream: bool) -> int:
    """One agent run, request after request; the number of requests answered."""
    for i, body in enumerate(bodies):
        headers = {
            "Authorization": "Bearer sk-bench",
            "Content-Type": "application/json",
            "X-Session-Id": session,
            "X-Sim-Chunks": str(STREAM_CHUNKS[i % 3]),
        }
        async with client.post(url + "/chat/completions", data=body, headers=headers) as response:
            data = await response.read()
            if response.status != 200:
                raise RuntimeError(f"{url}: HTTP {response.status}: {data[:300]!r}")
    return len(bodies)


async def _block(
    client: aiohttp.ClientSession, url: str, played: list[list[bytes]], tag: str, concurrency: int, stream: bool
) -> int:
    sessions = iter(enumerate(played))
    done = 0

    async def worker() -> None:
        nonlocal done
        for k, bodies in sessions:
            answered = await _play(client, url, f"{tag}-{k}", bodies, stream)
            done += answered  # not `done += await ...`: that reads `done` before the other workers add theirs

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


async def _mode(servers: Servers, stream: bool, concurrency: int, copies: int, rounds: int) -> dict[str, Any]:
    played = [bodies for bodies in runs(stream) for _ in range(copies)]
    targets: dict[str, Server] = {"relay": servers.relay, "proxy": servers.proxy}
    cpu = {t: 0.0 for t in TARGETS}
    wall = {t: 0.0 for t in TARGETS}
    count = {t: 0 for t in TARGETS}
    per_round: dict[str, list[float]] = {t: [] for t in TARGETS}
    nonce = time.monotonic_ns()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        for r, order in zip(range(rounds), itertools.cycle((TARGETS, TARGETS[::-1])), strict=False):
            for target in order:
                server = targets[target]
                before, started = server.cpu_seconds(), time.perf_counter()
                n = await _block(client, server.url, played, f"agent-{nonce}-{target}-{r}", concurrency, stream)
                seconds = server.cpu_seconds() - before
                cpu[target] += seconds
                wall[target] += time.perf_counter() - started
                count[target] += n
                per_round[target].append(seconds * 1e3 / n)
    out = {
        t: {"requests": count[t], "cpu_ms_per_req": cpu[t] * 1e3 / count[t], "rps": count[t] / wall[t]} for t in TARGETS
    }
    ratios = [p / r for p, r in zip(per_round["proxy"], per_round["relay"], strict=True)]
    return {
        "stream": stream,
        "concurrency": concurrency,
        "targets": out,
        "cpu_vs_relay": out["proxy"]["cpu_ms_per_req"] / out["relay"]["cpu_ms_per_req"],
        "cpu_vs_relay_by_round": ratios,
        "cpu_vs_relay_median_round": median(ratios),
        "throughput_vs_relay": out["proxy"]["rps"] / out["relay"]["rps"],
    }


def run_agent_turns(concurrency: int = 16, copies: int = 6, rounds: int = 4) -> dict[str, Any]:
    """json then stream; `copies` of each packaged run per block (140 requests a copy), `rounds` blocks a target."""
    with Servers() as servers:
        modes = [asyncio.run(_mode(servers, stream, concurrency, copies, rounds)) for stream in (False, True)]
        return {"traces": list_traces(), "model": MODEL, "copies": copies, "rounds": rounds, "modes": modes}


def render(result: dict[str, Any]) -> str:
    rows = []
    for m in result["modes"]:
        t = m["targets"]
        rows.append(
            [
                "stream" if m["stream"] else "json",
                m["concurrency"],
                t["relay"]["requests"],
                t["relay"]["cpu_ms_per_req"],
                t["proxy"]["cpu_ms_per_req"],
                m["cpu_vs_relay"],
                ", ".join(f"{r:.2f}" for r in m["cpu_vs_relay_by_round"]),
                m["throughput_vs_relay"],
            ]
        )
    header = ["mode", "conc", "requests a target", "relay CPU ms/req", "proxy CPU ms/req", "CPU proxy/relay"]
    header += ["by round", "throughput proxy/relay"]
    return (
        f"agent turns: the packaged runs ({', '.join(result['traces'])}), {result['copies']} copies each a block, "
        f"{result['rounds']} blocks a target, model {result['model']}\n" + table(header, rows)
    )
