"""The proxy's memory: idle, per idle session, per in-flight stream, and over many requests.

RSS is read from /proc for the proxy and the bare relay, both in their own processes and fed
the same requests; a session's retained state is also measured in-process with tracemalloc.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
import tracemalloc
from typing import Any

import aiohttp
import orjson

from bench.convo import Conversation
from bench.engine import handle, service
from bench.overhead import request_body
from bench.procs import ROOT, Server, Servers
from bench.stats import slope, table

MB = 1024 * 1024
SESSION_MODEL = "gpt-4o"  # 128k window: a 100k conversation fits
STREAM_MODEL = "gpt-4.1"  # 1M window: a 1 MB request fits


# Run in a fresh interpreter: RSS before and after loading o200k_base the proxy's way.
_ENCODING_RSS = """
import tiktoken, proxy.tokens.encodings
def rss():
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmRSS:"))
before = rss()
proxy.tokens.encodings.get_encoding("o200k_base")
print(before, rss())
"""


def encoding_rss() -> dict[str, int]:
    """What the o200k encoding alone costs any Python process (tiktoken imported first, so not counted)."""
    run = subprocess.run([sys.executable, "-c", _ENCODING_RSS], cwd=ROOT, capture_output=True, text=True, check=True)
    before, after = (int(v) for v in run.stdout.split())
    return {"before": before, "after": after}


def _headers(session: str, **extra: str) -> dict[str, str]:
    return {"Authorization": "Bearer sk-bench", "Content-Type": "application/json", "X-Session-Id": session, **extra}


async def _post(client: aiohttp.ClientSession, url: str, raw: bytes, headers: dict[str, str]) -> int:
    async with client.post(url + "/chat/completions", data=raw, headers=headers) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
        return response.status


def _conversation_steps(salt: str, tokens: int, steps: int) -> list[bytes]:
    """Request bodies of one conversation growing to `tokens` in `steps` requests."""
    conv = Conversation(salt)
    bodies = []
    for k in range(1, steps + 1):
        conv.grow_to(tokens * k // steps)
        bodies.append(orjson.dumps({"model": SESSION_MODEL, "messages": conv.messages, "tools": conv.tools}))
    return bodies


async def _sessions_rss(server: Server, client: aiohttp.ClientSession, sessions: int, tokens: int) -> dict[str, Any]:
    """RSS added per idle session after a `tokens`-token conversation sent in four growing requests."""
    for raw in _conversation_steps("mem-warm", tokens, 4):  # warm-up: encodings, arenas, connection
        await _post(client, server.url, raw, _headers("bench-mem-warm"))
    before = server.rss_bytes()
    conversation_bytes = 0
    for s in range(sessions):
        bodies = _conversation_steps(f"mem-{s}-{time.monotonic_ns()}", tokens, 4)
        conversation_bytes = len(bodies[-1])
        for raw in bodies:
            await _post(client, server.url, raw, _headers(f"bench-mem-{s}"))
    per_session = (server.rss_bytes() - before) / sessions
    return {"rss_per_session": per_session, "conversation_bytes": conversation_bytes}


def session_state_traced(tokens: int) -> dict[str, Any]:
    """In-process: bytes still allocated after one session's conversation, once the request bodies are gone.

    Split in three: what the session owns (journal, stats), what went into the shared, bounded
    token-count cache (`proxy/tokens/counter.py`, one LRU per encoding for every session), and the body
    memo (`proxy/service/body_memos.py`: the last body's messages, parsed, within `[state] body_memo_mb`; it also
    holds the digests, which the journal shares).
    """
    svc = service()
    warm = _conversation_steps("traced-warm", tokens, 4)
    for raw in warm:
        handle(svc, raw, "bench-traced-warm")
    bodies = _conversation_steps(f"traced-{time.monotonic_ns()}", tokens, 4)
    conversation_bytes = len(bodies[-1])
    gc.collect()
    tracemalloc.start(8)
    try:
        before = tracemalloc.take_snapshot()
        for raw in bodies:
            handle(svc, raw, "bench-traced")
        del bodies, raw
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    retained = sum(d.size_diff for d in after.compare_to(before, "filename"))

    def allocated_in(path: str) -> int:
        where = tracemalloc.Filter(True, path, all_frames=True)
        diff = after.filter_traces([where]).compare_to(before.filter_traces([where]), "filename")
        return sum(d.size_diff for d in diff)

    shared, memo = allocated_in("*/proxy/tokens/counter.py"), allocated_in("*/proxy/service/body_memos.py")
    return {
        "traced_per_session": retained - shared - memo,
        "traced_shared_cache": shared,
        "traced_body_memo": memo,
        "conversation_bytes": conversation_bytes,
    }


async def _peak_rss(server: Server, work: asyncio.Future, every_s: float = 0.02) -> int:
    peak = server.rss_bytes()
    while not work.done():
        peak = max(peak, server.rss_bytes())
        await asyncio.sleep(every_s)
    return max(peak, server.rss_bytes())


def _big_body(salt: str, size: int) -> bytes:
    conv = Conversation(salt)
    tokens = size // 5  # about 4 bytes of JSON per token
    while True:
        conv.grow_to(tokens)
        raw = orjson.dumps({"model": STREAM_MODEL, "messages": conv.messages, "tools": conv.tools, "stream": True})
        if len(raw) >= size:
            return raw
        tokens += max(1000, size // 50)


async def _streams_rss(
    server: Server, client: aiohttp.ClientSession, streams: int, size: int, delay_ms: int
) -> dict[str, Any]:
    """Peak RSS added per concurrent stream of a `size`-byte request (slow upstream: all in flight at once)."""
    slow = {"X-Sim-Delay-Ms": str(delay_ms), "X-Sim-Chunks": "16"}
    await _post(client, server.url, _big_body("stream-warm", size), _headers("bench-stream-warm", **slow))
    bodies = [_big_body(f"stream-{i}-{time.monotonic_ns()}", size) for i in range(streams)]
    gc.collect()
    before = server.rss_bytes()
    work = asyncio.ensure_future(
        asyncio.gather(
            *(_post(client, server.url, b, _headers(f"bench-stream-{i}", **slow)) for i, b in enumerate(bodies))
        )
    )
    peak = await _peak_rss(server, work)
    await work
    return {"rss_per_stream": (peak - before) / streams, "after_per_stream": (server.rss_bytes() - before) / streams}


async def _slope(server: Server, client: aiohttp.ClientSession, requests: int, concurrency: int) -> dict[str, Any]:
    """RSS over `requests` small requests in 100 rotating sessions; slope over the second half."""
    raw = request_body(False)
    xs: list[float] = []
    ys: list[float] = []
    every = max(1, requests // 20)
    counter = iter(range(requests))

    async def worker() -> None:
        for i in counter:
            await _post(client, server.url, raw, _headers(f"bench-slope-{i % 100}"))
            if i % every == 0:
                xs.append(i)
                ys.append(server.rss_bytes())

    start = server.rss_bytes()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    half = len(xs) // 2
    kb_per_1000 = slope(xs[half:], ys[half:]) * 1000 / 1024
    return {
        "kb_per_1000_requests": kb_per_1000,
        "rss_start": start,
        "rss_end": server.rss_bytes(),
        "requests": requests,
    }


async def run_memory(
    sessions: int = 8,
    tokens: int = 100_000,
    streams: int = 8,
    stream_bytes: int = MB,
    requests: int = 10_000,
    stream_delay_ms: int = 100,
    servers: Servers | None = None,
) -> dict[str, Any]:
    """Every memory figure; `servers` (else a fresh trio) should not have served anything yet."""
    own = servers is None
    servers = servers or Servers()
    try:
        idle = {"proxy": servers.proxy.rss_bytes(), "relay": servers.relay.rss_bytes()}
        out: dict[str, Any] = {"engine": servers.proxy.engine, "idle_rss": idle, "encoding": encoding_rss()}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
            for server in (servers.relay, servers.proxy):  # one request: encodings loaded, pools open
                await _post(client, server.url, request_body(False), _headers("bench-first"))
            out["warm_idle_rss"] = {"proxy": servers.proxy.rss_bytes(), "relay": servers.relay.rss_bytes()}
            out["sessions"] = {
                **await _sessions_rss(servers.proxy, client, sessions, tokens),
                **session_state_traced(tokens),
                "sessions": sessions,
                "tokens": tokens,
            }
            out["streams"] = {
                t: await _streams_rss(s, client, streams, stream_bytes, stream_delay_ms)
                for t, s in (("relay", servers.relay), ("proxy", servers.proxy))
            }
            out["streams"]["streams"], out["streams"]["request_bytes"] = streams, stream_bytes
            out["slope"] = {
                t: await _slope(s, client, requests, 8) for t, s in (("relay", servers.relay), ("proxy", servers.proxy))
            }
        return out
    finally:
        if own:
            servers.close()


def render(result: dict[str, Any]) -> str:
    idle, sess, streams, slopes = result["idle_rss"], result["sessions"], result["streams"], result["slope"]
    warm = result["warm_idle_rss"]
    conv = sess["conversation_bytes"]
    rows = [
        ["idle RSS at start (MB)", idle["relay"] / MB, idle["proxy"] / MB, idle["proxy"] / idle["relay"]],
        ["idle RSS after one request (MB)", warm["relay"] / MB, warm["proxy"] / MB, warm["proxy"] / warm["relay"]],
        [f"per in-flight stream of a {streams['request_bytes'] / 1024:,.0f} KB request, peak (MB)",
         streams["relay"]["rss_per_stream"] / MB, streams["proxy"]["rss_per_stream"] / MB,
         streams["proxy"]["rss_per_stream"] / max(1, streams["relay"]["rss_per_stream"])],
        ["... left after the streams end, per stream (MB)", streams["relay"]["after_per_stream"] / MB,
         streams["proxy"]["after_per_stream"] / MB, "-"],
        [f"RSS slope over {slopes['proxy']['requests']:,} requests (KB per 1000)",
         slopes["relay"]["kb_per_1000_requests"], slopes["proxy"]["kb_per_1000_requests"], "-"],
    ]  # fmt: skip
    return "\n".join(
        [
            f"engine: {result['engine']}",
            table(["measure", "bare relay", "proxy", "proxy/relay"], rows),
            "",
            f"per idle session after a {sess['tokens']:,}-token conversation ({conv:,} bytes of JSON), "
            f"{sess['sessions']} sessions: RSS +{sess['rss_per_session'] / 1024:,.0f} KB "
            f"({sess['rss_per_session'] / conv:.1%} of the conversation); "
            f"tracemalloc: the session's own state {sess['traced_per_session'] / 1024:,.0f} KB "
            f"({sess['traced_per_session'] / conv:.1%}), plus {sess['traced_shared_cache'] / 1024:,.0f} KB "
            "into the shared, bounded token-count cache and "
            f"{sess['traced_body_memo'] / 1024:,.0f} KB ({sess['traced_body_memo'] / conv:.0%}) in the body memo "
            "(bounded by [state] body_memo_mb)",
            "",
            f"o200k_base alone, in a fresh Python process with tiktoken imported: "
            f"{result['encoding']['before'] / MB:.1f} -> {result['encoding']['after'] / MB:.1f} MB "
            f"(+{(result['encoding']['after'] - result['encoding']['before']) / MB:.1f} MB)",
        ]
    )
