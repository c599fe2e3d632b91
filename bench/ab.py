"""New against old in one run: the proxy of this tree and of an earlier commit, CPU per request side by side.

`python -m bench ab --ref REV [-n N]`: `git archive REV` is unpacked into a temporary folder and
both proxies (each in its own process, the real ContextService) serve the overhead benchmark's
body from one simulator, in blocks at concurrency 16 that alternate old/new, json then stream.
Read the ratios: on a shared 2-core machine the absolute figures drift between runs.
"""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import aiohttp

from bench.overhead import _block, _blocks, request_body
from bench.procs import ROOT, Server, spawn, tree_at
from bench.stats import table

CONCURRENCY = 16


async def _compare(old: Server, new: Server, stream: bool, n: int, rounds: int) -> dict[str, Any]:
    body = request_body(stream)
    servers = {"old": old, "new": new}
    async with aiohttp.ClientSession() as client:
        for server in servers.values():
            await _block(client, server.url, body, CONCURRENCY * 10, CONCURRENCY)  # warm-up
        urls = {name: server.url for name, server in servers.items()}
        runs = await _blocks(client, urls, body, n * rounds, CONCURRENCY, rounds, processes=servers)
    rows = {
        name: {
            "cpu_ms_per_request": run.cpu_s / len(run.samples) * 1e3,
            "requests_per_s": len(run.samples) / run.seconds,
        }
        for name, run in runs.items()
    }
    return {
        **rows,
        "cpu_new_over_old": rows["new"]["cpu_ms_per_request"] / rows["old"]["cpu_ms_per_request"],
        "throughput_new_over_old": rows["new"]["requests_per_s"] / rows["old"]["requests_per_s"],
    }


def run_ab(ref: str, n: int = 800, rounds: int = 8) -> dict[str, Any]:
    with tree_at(ref) as tree:
        sim = spawn("sim")
        servers = [sim]
        try:
            old = spawn("proxy", "--upstream", sim.url, tree=tree)
            servers.append(old)
            new = spawn("proxy", "--upstream", sim.url)
            servers.append(new)
            modes = {mode: asyncio.run(_compare(old, new, mode == "stream", n, rounds)) for mode in ("json", "stream")}
        finally:
            for server in servers:
                server.stop()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    return {"ref": ref, "head": head.strip(), "concurrency": CONCURRENCY, "requests_per_block": n, "modes": modes}


def render(result: dict[str, Any]) -> str:
    rows = [
        [
            mode,
            r["old"]["cpu_ms_per_request"],
            r["new"]["cpu_ms_per_request"],
            r["cpu_new_over_old"],
            r["old"]["requests_per_s"],
            r["new"]["requests_per_s"],
            r["throughput_new_over_old"],
        ]
        for mode, r in result["modes"].items()
    ]
    header = ["mode", "old CPU ms/req", "new CPU ms/req", "new/old CPU", "old req/s", "new req/s", "new/old req/s"]
    return (
        f"proxy at {result['ref']} (old) against the working tree at {result['head']} (new), "
        f"concurrency {result['concurrency']}, {result['requests_per_block']} requests a block\n" + table(header, rows)
    )
