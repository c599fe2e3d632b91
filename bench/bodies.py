"""`python -m bench bodies [-n CONCURRENT]`: the proxy's RSS while many large chat bodies arrive at once.

Eight (by default) clients each send a 24 MB chat body at the same moment, through the proxy with
its default config (`server.body_budget_mb`), to the simulator; a client answered 503 waits its
`Retry-After` and sends again, as the SDKs do. The proxy's RSS is sampled every 20 ms from /proc.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from bench.procs import spawn

BODY_MB = 24
MESSAGE_BYTES = 8 * 1024
DEADLINE_S = 600
_LINE = "the quick brown fox jumps over a lazy dog while seven engineers measure resident memory"


def chat_body(mb: float, salt: int) -> bytes:
    """A chat body of about `mb` MB: an agent's turns of ~8 KB each, distinct per client (`salt`)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are agent {salt}."}]
    text = (_LINE + "\n") * (MESSAGE_BYTES // (len(_LINE) + 1))
    i = 0
    while len(messages) * MESSAGE_BYTES < mb * 1024 * 1024:
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"step {salt}-{i}\n{text}"})
        i += 1
    messages.append({"role": "user", "content": "Summarise."})
    return orjson.dumps({"model": "gpt-4.1", "messages": messages})


async def _client(session: aiohttp.ClientSession, url: str, body: bytes, stats: dict[str, int]) -> None:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        headers = {"Content-Type": "application/json"}
        async with session.post(url, data=body, headers=headers) as response:
            await response.read()
            if response.status != 503:
                stats[str(response.status)] = stats.get(str(response.status), 0) + 1
                return
            stats["503"] = stats.get("503", 0) + 1
            await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
    stats["gave_up"] = stats.get("gave_up", 0) + 1


async def _sample(rss: list[int], read: Any, stop: asyncio.Event) -> None:
    while not stop.is_set():
        rss.append(read())
        await asyncio.sleep(0.02)


async def run_bodies(concurrent: int = 8, mb: float = BODY_MB) -> dict[str, Any]:
    sim = spawn("sim")
    proxy = spawn("proxy", "--upstream", sim.url)
    try:
        bodies = [chat_body(mb, i) for i in range(concurrent)]
        await asyncio.sleep(1)
        idle = proxy.rss_bytes()
        rss: list[int] = []
        stats: dict[str, int] = {}
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample(rss, proxy.rss_bytes, stop))
        started = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=DEADLINE_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            url = f"{proxy.url}/chat/completions"
            await asyncio.gather(*(_client(session, url, body, stats) for body in bodies))
        elapsed = time.monotonic() - started
        stop.set()
        await sampler
        return {
            "concurrent": concurrent,
            "body_mb": round(len(bodies[0]) / 1024 / 1024, 1),
            "rss_idle_mb": round(idle / 1024 / 1024),
            "rss_peak_mb": round(max(rss) / 1024 / 1024),
            "answers": stats,
            "seconds": round(elapsed, 1),
        }
    finally:
        proxy.stop()
        sim.stop()


def render(result: dict[str, Any]) -> str:
    return (
        f"{result['concurrent']} concurrent chat bodies of {result['body_mb']} MB through the proxy (default config)\n"
        f"RSS idle {result['rss_idle_mb']} MB, peak {result['rss_peak_mb']} MB; "
        f"answers {result['answers']} (503s retried after Retry-After); {result['seconds']} s"
    )
