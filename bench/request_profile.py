"""Where each microsecond of a request's CPU goes, by feature: the proxy's warm turn, a passthrough, the bare relay.

`python -m bench request-profile [-n N]`: the simulator, the bare relay (bench/relay.py), the proxy
with its engine and the proxy without one (`--passthrough`: the shell alone) each run in their own
process, sampled by bench/cpu_sampler.py (CPU time of the main thread, so a loaded machine's waits
are not counted). Each gets N requests of bench/overhead.py's body at concurrency 16, json then
stream, after a warm-up; every request after the first of the proxy's is a warm turn of one session.
The tables give µs of CPU per request: the whole process (/proc) and its main thread, then that
CPU split by the samples' shares: by feature (the outermost proxy function below the handler), by
the innermost proxy function, and by where the leaf frame ran (the relay's column is aiohttp's own).
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.overhead import _block, request_body
from bench.procs import Server, spawn
from bench.stats import table

CONCURRENCY = 16
TARGETS = ("relay", "passthrough", "proxy")


def _wait_for(path: Path, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            time.sleep(0.05)
            return orjson.loads(path.read_bytes())
        time.sleep(0.05)
    raise RuntimeError(f"no profile written to {path}")


async def _profile_target(server: Server, profile: Path, stream: bool, n: int) -> dict[str, Any]:
    body = request_body(stream)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        await _block(client, server.url, body, CONCURRENCY * 8, CONCURRENCY)  # warm-up: connections, session
        profile.unlink(missing_ok=True)
        cpu_before = server.cpu_seconds()
        os.kill(server.pid, signal.SIGUSR1)
        await asyncio.sleep(0.05)
        samples = await _block(client, server.url, body, n, CONCURRENCY)
        os.kill(server.pid, signal.SIGUSR2)
        cpu = server.cpu_seconds() - cpu_before
    if stream and not all(s.events == s.expected for s in samples):
        raise RuntimeError(f"{server.kind}: a stream lost or merged events")
    data = _wait_for(profile)
    return _per_request(data, cpu, len(samples))


def _per_request(data: dict[str, Any], process_cpu_s: float, n: int) -> dict[str, Any]:
    """µs per request by feature, place and leaf: the samples' shares of the process's CPU time (from /proc)."""
    sampled = sum(row[3] for row in data["rows"]) or 1.0
    scale = process_cpu_s * 1e6 / n / sampled
    features: dict[str, float] = defaultdict(float)
    places: dict[str, float] = defaultdict(float)
    leaves: dict[str, float] = defaultdict(float)
    for feature, place, leaf, seconds in data["rows"]:
        us = seconds * scale
        features[feature] += us
        if place != "-":
            places[place] += us
        leaves[leaf] += us
    return {
        "n": n,
        "process_us": process_cpu_s * 1e6 / n,
        "thread_cpu_us": data["thread_cpu_s"] * 1e6 / n,
        "features": dict(sorted(features.items(), key=lambda kv: -kv[1])),
        "places": dict(sorted(places.items(), key=lambda kv: -kv[1])),
        "leaves": dict(sorted(leaves.items(), key=lambda kv: -kv[1])),
    }


def run_request_profile(n: int = 1600) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="request-profile-") as folder:
        sim = spawn("sim")
        servers: dict[str, Server] = {}
        files = {t: Path(folder) / f"{t}.json" for t in TARGETS}
        try:
            servers["relay"] = spawn("relay", "--upstream", sim.url, "--profile", str(files["relay"]))
            servers["passthrough"] = spawn(
                "proxy", "--upstream", sim.url, "--passthrough", "--profile", str(files["passthrough"])
            )
            servers["proxy"] = spawn("proxy", "--upstream", sim.url, "--profile", str(files["proxy"]))
            modes = {}
            for mode in ("json", "stream"):
                modes[mode] = {
                    t: asyncio.run(_profile_target(servers[t], files[t], mode == "stream", n)) for t in TARGETS
                }
        finally:
            for server in [*servers.values(), sim]:
                server.stop()
    return {"concurrency": CONCURRENCY, "requests": n, "modes": modes, "load": os.getloadavg()[0]}


def _rows(named: dict[str, float], total: float, limit: int) -> list[list[Any]]:
    rows = [[name, us, us / total if total else 0.0] for name, us in list(named.items())[:limit]]
    rest = sum(list(named.values())[limit:])
    if rest:
        rows.append(["(the rest)", rest, rest / total if total else 0.0])
    return rows


def render(result: dict[str, Any]) -> str:
    lines = [
        f"CPU µs per request at concurrency {result['concurrency']}, {result['requests']} requests per target and mode "
        f"(machine load {result['load']:.1f} at the end: shared with other work)",
    ]
    for mode, targets in result["modes"].items():
        summary = [[t, r["process_us"], r["thread_cpu_us"]] for t, r in targets.items()]
        relay = targets["relay"]["process_us"]
        for row, t in zip(summary, targets, strict=True):
            row.append(targets[t]["process_us"] / relay if relay else 0.0)
        lines += [
            "",
            f"## {mode}",
            table(["target", "process CPU µs/req", "main thread sampled µs/req", "/ relay"], summary),
        ]
        for t in ("proxy", "passthrough"):
            r = targets[t]
            lines += [
                "",
                f"{t}: by feature (outermost proxy function below the handler)",
                table(["feature", "µs/req", "share"], _rows(r["features"], r["process_us"], 14)),
                "",
                f"{t}: by innermost proxy function",
                table(["function", "µs/req", "share"], _rows(r["places"], r["process_us"], 22)),
            ]
        leaf_names = list(dict.fromkeys(name for r in targets.values() for name in r["leaves"]))
        leaf_rows = [[name, *(targets[t]["leaves"].get(name, 0.0) for t in TARGETS)] for name in leaf_names]
        lines += ["", "by where the leaf frame ran (µs/req)", table(["where", *TARGETS], leaf_rows)]
    return "\n".join(lines)
