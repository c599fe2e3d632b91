"""Does a big conversation's engine work hold other streams back? `python -m bench stall`.

A stream paced at 5 ms a chunk runs through the proxy while a cold 200k-token conversation
(a new session) is sent through it too. The big request carries `X-Sim-Fault: status-500`, so
the simulator answers it without counting it (it would otherwise stall its own event loop and
pace the stream late itself); the proxy still does all its work on the body. Reported: the
largest gap between the stream's chunks, with the engine on its worker thread (as shipped) and
with every body prepared inline on the event loop (`INLINE_COST` raised), in the same run.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from typing import Any

import aiohttp
import orjson

from bench.convo import Conversation
from bench.procs import spawn
from proxy.config.loader import ConfigHolder, load_settings
from proxy.service import scheduling
from proxy.service.engine_service import build_context_service
from proxy.shell import server

PACING_MS = 5
SIZE = 200_000


async def _max_gap(client: aiohttp.ClientSession, url: str, big: bytes, tag: str) -> float:
    small = orjson.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]})

    async def stream() -> float:
        arrivals = []
        headers = {"Content-Type": "application/json", "X-Sim-Delay-Ms": str(PACING_MS), "X-Session-Id": tag}
        async with client.post(url, data=small, headers=headers) as response:
            async for _ in response.content.iter_any():
                arrivals.append(time.monotonic())
        return max(b - a for a, b in itertools.pairwise(arrivals))

    async def cold() -> None:
        await asyncio.sleep(0.05)  # the stream is flowing
        headers = {"Content-Type": "application/json", "X-Sim-Fault": "status-500", "X-Session-Id": f"{tag}-big"}
        async with client.post(url, data=big, headers=headers) as response:
            await response.read()

    gap, _ = await asyncio.gather(stream(), cold())
    return gap * 1000


async def run_stall(rounds: int = 3, size: int = SIZE) -> dict[str, Any]:
    sim = spawn("sim", "--chunks", "60")
    shipped = scheduling.INLINE_COST
    result: dict[str, Any] = {"pacing_ms": PACING_MS, "tokens": size, "rounds": rounds}
    try:
        async with aiohttp.ClientSession() as client:
            for mode, offload in (("worker thread", shipped), ("inline", 10**15)):
                scheduling.INLINE_COST = offload
                holder = ConfigHolder(load_settings(upstream_url=sim.url), upstream_url=sim.url)
                runner, port = await server.start(holder, context=build_context_service(holder))
                try:
                    gaps = []
                    for k in range(rounds):
                        conversation = Conversation(f"stall-{mode}-{k}-{time.monotonic_ns()}")  # cold: never seen
                        conversation.grow_to(size)
                        body = {"model": "gpt-4.1", "messages": conversation.messages, "tools": conversation.tools}
                        url = f"http://127.0.0.1:{port}/v1/chat/completions"
                        gaps.append(await _max_gap(client, url, orjson.dumps(body), f"stall-{mode}-{k}"))
                    result[mode] = gaps
                finally:
                    await runner.cleanup()
    finally:
        scheduling.INLINE_COST = shipped
        sim.stop()
    return result


def render(result: dict[str, Any]) -> str:
    lines = [
        f"largest gap between chunks of a stream paced at {result['pacing_ms']} ms, while a cold "
        f"{result['tokens']:,}-token conversation goes through the same proxy ({result['rounds']} rounds):",
    ]
    for mode in ("worker thread", "inline"):
        gaps = result[mode]
        lines.append(
            f"  {mode:<14} median {statistics.median(gaps):6.1f} ms   each: " + ", ".join(f"{g:.1f}" for g in gaps)
        )
    return "\n".join(lines)
