"""One very long SSE event (no blank line for tens of MB) through the proxy: time and memory, chat vs passthrough.

`python -m bench long-event [-n MB] [--ref REV]`: an upstream in its own process streams a chat
answer whose second event carries N MB of content (40 and 80 MB by default) in 64 KB writes;
the proxy (its own process, the real ContextService) relays it on the chat route (SSE framing,
usage reading, end watch) and on a passthrough path (`/v1/completions`, bytes only). The client
reads every byte and checks the length. With `--ref`, the proxy of that commit runs the same.
Figures: seconds to relay the whole answer, the proxy's CPU seconds, and its peak RSS (VmHWM).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.procs import ROOT, Server, spawn, tree_at
from bench.stats import table

WRITE = 64 * 1024
HEAD = b'data: {"id":"chatcmpl-long","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"'
TAIL = b'"},"finish_reason":null}]}\n\n'
END = (
    b'data: {"id":"chatcmpl-long","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},'
    b'"finish_reason":"stop"}]}\n\n'
    b'data: {"id":"chatcmpl-long","object":"chat.completion.chunk","choices":[],'
    b'"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}\n\n'
    b"data: [DONE]\n\n"
)
FIRST = (
    b'data: {"id":"chatcmpl-long","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"role":"assistant"}}]}\n\n'
)


def answer_size(mb: int) -> int:
    return len(FIRST) + len(HEAD) + mb * 1024 * 1024 + len(TAIL) + len(END)


async def long_answer(request: web.Request) -> web.StreamResponse:
    """Any POST: a chat stream whose second event holds `X-Long-MB` MB of content (`X-Long-Cut`: cut there)."""
    await request.read()
    mb = int(request.headers.get("X-Long-MB", "40"))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(FIRST + HEAD)
    block = b"a" * WRITE
    for _ in range(mb * 1024 * 1024 // WRITE):
        await response.write(block)
    if "X-Long-Cut" in request.headers and request.transport is not None:
        request.transport.close()  # the connection ends inside the long event
        return response
    await response.write(TAIL + END)
    return response


async def start_upstream() -> tuple[web.AppRunner, int, str]:
    """The upstream, for `python -m bench.serve long-event`."""
    app = web.Application()
    app.router.add_post("/{tail:.*}", long_answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1], "long-event"


def peak_rss(server: Server) -> int:
    """The process's peak resident set so far (VmHWM), bytes."""
    for line in Path(f"/proc/{server.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


async def _relay_once(proxy: Server, path: str, mb: int) -> dict[str, float]:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Write a lot."}], "stream": True}
    body["stream_options"] = {"include_usage": True}  # the engine then keeps the usage chunk: every byte comes back
    cpu, started, received = proxy.cpu_seconds(), time.perf_counter(), 0
    timeout = aiohttp.ClientTimeout(total=900)
    async with (
        aiohttp.ClientSession(timeout=timeout) as client,
        client.post(f"{proxy.url}/{path}", json=body, headers={"X-Long-MB": str(mb)}) as response,
    ):
        async for chunk in response.content.iter_any():
            received += len(chunk)
    assert received == answer_size(mb), (path, received, answer_size(mb))
    return {
        "seconds": time.perf_counter() - started,
        "cpu_s": proxy.cpu_seconds() - cpu,
        "rss_mb": proxy.rss_bytes() / 2**20,
        "peak_rss_mb": peak_rss(proxy) / 2**20,
    }


def _measure(label: str, upstream: Server, sizes: list[int], tree: Path = ROOT) -> list[dict[str, Any]]:
    proxy = spawn("proxy", "--upstream", upstream.url, tree=tree)
    try:
        for path in ("completions", "chat/completions"):  # warm: the chat route loads its token encoding once
            asyncio.run(_relay_once(proxy, path, 0))
        rows = [{"proxy": label, "route": "warm", "mb": 0, "peak_rss_mb": peak_rss(proxy) / 2**20}]
        for mb in sizes:
            for route, path in (("passthrough", "completions"), ("chat", "chat/completions")):
                rows.append({"proxy": label, "route": route, "mb": mb, **asyncio.run(_relay_once(proxy, path, mb))})
        return rows
    finally:
        proxy.stop()


def run_long_event(sizes: list[int], ref: str | None = None) -> dict[str, Any]:
    upstream = spawn("long-event")
    try:
        rows = _measure("this tree", upstream, sizes)
        if ref:
            with tree_at(ref) as tree:
                rows += _measure(ref, upstream, sizes, tree)
    finally:
        upstream.stop()
    return {"sizes_mb": sizes, "rows": rows}


def render(result: dict[str, Any]) -> str:
    header = ["proxy", "route", "event MB", "seconds", "proxy CPU s", "proxy RSS MB after", "proxy peak RSS MB"]
    rows = [
        [
            r["proxy"],
            r["route"],
            r["mb"],
            r.get("seconds", "-"),
            r.get("cpu_s", "-"),
            r.get("rss_mb", "-"),
            r["peak_rss_mb"],
        ]
        for r in result["rows"]
    ]
    return "one SSE event of N MB (64 KB writes), relayed whole; peak RSS is the process's high-water mark so far\n" + (
        table(header, rows)
    )
