"""The load run (not collected by pytest): 200 concurrent streams over 100 sessions for 30 s, on 127.0.0.1 only.

    python -m tests.load_soak [--seconds 30] [--concurrency 200] [--sessions 100] [--max-sessions 50]

The simulator and the proxy (`context-proxy serve`, real engine) run as subprocesses, so the
RSS figures are the proxy's alone. A direct phase against the simulator gives the baseline
for "added latency" (p50/p99 through the proxy minus p50/p99 direct). Then a sequential pass
checks that sessions beyond `state.max_sessions` were evicted oldest idle first.
Exit status 0 only when every check held.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

HOST = "127.0.0.1"
MAX_REQUESTS = 500_000  # a hard cap on the count, whatever the speed
HISTORY_TURNS = 12  # a session's conversation restarts after this many turns (bounded bodies)
TOOL_OUTPUT = "\n".join(f"src/parser.py:{i}: def parse_{i}(value): return value.split('-')" for i in range(40))


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def rss_kb(pid: int, field_name: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Tally:
    ttfb: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.total) + len(self.errors)


def conversation(session: int, turn: int) -> list[dict]:
    """Turn `turn` of an agent conversation: a tool call and its output per earlier turn."""
    messages: list[dict] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": f"Session {session}: the date parser test fails; fix it."},
    ]
    for i in range(turn):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "grep", "arguments": f'{{"n": {i}}}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"[{i}]\n{TOOL_OUTPUT}"})
    if not turn:
        messages.append({"role": "user", "content": "Start."})
    return messages


async def one_request(client: aiohttp.ClientSession, url: str, session: int, turn: int, tally: Tally) -> None:
    body = {"model": "gpt-4o", "messages": conversation(session, turn), "stream": True}
    headers = {"X-Session-Id": f"load-{session}", "Authorization": "Bearer sk-load"}
    started = time.perf_counter()
    try:
        async with client.post(url, data=orjson.dumps(body), headers=headers) as response:
            first = await response.content.readany()
            ttfb = time.perf_counter() - started
            rest = await response.read()
            if response.status != 200:
                tally.errors.append(f"status {response.status}")
            elif not (first + rest).rstrip().endswith(b"data: [DONE]"):
                tally.errors.append("stream ended without [DONE]")
            else:
                tally.ttfb.append(ttfb)
                tally.total.append(time.perf_counter() - started)
    except (aiohttp.ClientError, TimeoutError) as exc:
        tally.errors.append(type(exc).__name__)


async def drive(url: str, seconds: float, concurrency: int, sessions: int) -> Tally:
    """`concurrency` workers, worker w on session w % sessions, each turn one step further."""
    tally = Tally()
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)

    async def worker(w: int) -> None:
        turn = 0
        while time.monotonic() < deadline and tally.count < MAX_REQUESTS:
            await one_request(client, url, w % sessions, turn, tally)
            turn = (turn + 1) % HISTORY_TURNS

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return tally


def start_simulator_process() -> tuple[subprocess.Popen, str]:
    code = (
        "import asyncio, sys\n"
        "from proxy.demo.simulator import SimulatorConfig, start_simulator\n"
        "async def main():\n"
        "    runner, url = await start_simulator(SimulatorConfig(chunks=8, chunk_delay_s=0.005, record_limit=10))\n"
        "    print(url, flush=True)\n"
        "    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)\n"
        "asyncio.run(main())\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return process, process.stdout.readline().strip()


def write_config(folder: Path, upstream: str, port: int, max_sessions: int) -> Path:
    path = folder / "proxy.toml"
    path.write_text(
        f'[server]\nhost = "{HOST}"\nport = {port}\n\n'
        f'[upstream]\nbase_url = "{upstream}"\nconnect_timeout_s = 5\nread_timeout_s = 30\n\n'
        f"[state]\nmax_sessions = {max_sessions}\n\n"
        '[models."*"]\ncontext_window = 16000\nencoding = "o200k_base"\n'
        "input_per_mtok = 2.5\ncached_input_per_mtok = 1.25\noutput_per_mtok = 10.0\n\n"
        "[policy]\nreserve_output_tokens = 1000\n\n"
        "[policy.clear_tool_outputs]\nkeep_tokens = 2000\nkeep_under = 100\nclear_at_least = 500\n"
    )
    return path


async def wait_healthy(root: str, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    async with aiohttp.ClientSession() as client:
        while time.monotonic() < end:
            with contextlib.suppress(aiohttp.ClientError):
                async with client.get(root + "/healthz") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError("the proxy did not come up")


async def sample_rss(pid: int, stop: asyncio.Event, peak: list[int], timeline: list[tuple[float, int]]) -> None:
    started = time.monotonic()
    while not stop.is_set():
        rss = rss_kb(pid)
        peak[0] = max(peak[0], rss)
        timeline.append((time.monotonic() - started, rss))
        await asyncio.sleep(0.25)


def rss_marks(timeline: list[tuple[float, int]], marks: int = 6) -> str:
    """RSS at evenly spaced moments of the run: growth that levels off reads differently from a leak."""
    if not timeline:
        return "-"
    picks = [timeline[min(len(timeline) - 1, round(k * (len(timeline) - 1) / marks))] for k in range(marks + 1)]
    return ", ".join(f"{t:.0f} s {kb / 1024:.1f}" for t, kb in picks)


async def eviction_check(root: str, max_sessions: int) -> tuple[bool, str]:
    """Touch evict-0 .. evict-(max+9) in order: the first ten (the oldest idle) must be the ones gone."""
    names = [f"evict-{i}" for i in range(max_sessions + 10)]
    async with aiohttp.ClientSession() as client:
        for i, name in enumerate(names):
            body = {"model": "gpt-4o", "messages": conversation(1000 + i, 0)}
            async with client.post(root + "/v1/chat/completions", json=body, headers={"X-Session-Id": name}) as r:
                await r.read()
        async with client.get(root + "/sessions") as response:
            rows = await response.json()
    kept = {row["id"] for row in rows}
    expected = set(names[10:])
    ok = kept == expected
    return ok, f"{len(kept)} kept; oldest ten gone: {not kept & set(names[:10])}; load sessions gone: " + str(
        not any(k.startswith("load-") for k in kept)
    )


async def main(args: argparse.Namespace) -> int:
    sim, sim_url = start_simulator_process()
    port = free_port()
    root = f"http://{HOST}:{port}"
    with tempfile.TemporaryDirectory() as folder:
        config = write_config(Path(folder), sim_url, port, args.max_sessions)
        proxy = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--log-level", "WARNING"],
            stdout=subprocess.DEVNULL,
            stderr=open(Path(folder) / "proxy.log", "w"),  # noqa: SIM115
        )
        try:
            await wait_healthy(root)
            await drive(sim_url + "/chat/completions", 2, args.concurrency, args.sessions)  # warm-up: connections
            direct_started = time.monotonic()
            direct = await drive(sim_url + "/chat/completions", args.direct_seconds, args.concurrency, args.sessions)
            direct_elapsed = time.monotonic() - direct_started
            # Warm-up at the load's own concurrency, so "start" already holds the working set of that many
            # streams in flight (buffers, pooled connections, every session): what stays above it is growth.
            await drive(root + "/v1/chat/completions", 5, args.concurrency, args.sessions)
            await asyncio.sleep(2)
            rss_start = rss_kb(proxy.pid)
            peak, stop, timeline = [rss_start], asyncio.Event(), []
            sampler = asyncio.create_task(sample_rss(proxy.pid, stop, peak, timeline))
            started = time.monotonic()
            proxied = await drive(root + "/v1/chat/completions", args.seconds, args.concurrency, args.sessions)
            elapsed = time.monotonic() - started
            stop.set()
            await sampler
            await asyncio.sleep(args.settle_seconds)
            rss_after = rss_kb(proxy.pid)
            evicted_ok, evicted_note = await eviction_check(root, args.max_sessions)
            await asyncio.sleep(1)
            rss_evicted = rss_kb(proxy.pid)  # every load session evicted by the check's sessions
            alive = proxy.poll() is None
        finally:
            proxy.terminate()
            proxy.wait(10)
            sim.stdin.close()
            sim.terminate()
            sim.wait(10)
        log_tail = (Path(folder) / "proxy.log").read_text()[-2000:]

    ms = 1000.0
    print(f"load: {proxied.count} streamed requests in {elapsed:.1f} s ({proxied.count / elapsed:.0f}/s), "
          f"concurrency {args.concurrency}, {args.sessions} sessions, max_sessions {args.max_sessions}")  # fmt: skip
    print(f"direct baseline: {direct.count} streamed requests in {direct_elapsed:.1f} s "
          f"({direct.count / direct_elapsed:.0f}/s), same concurrency and sessions")  # fmt: skip
    print(f"errors: {len(proxied.errors)} proxied {sorted(set(proxied.errors))[:5]}, {len(direct.errors)} direct")
    for name, via, base in (("TTFB ", proxied.ttfb, direct.ttfb), ("total", proxied.total, direct.total)):
        print(
            f"{name}: direct p50 {percentile(base, 0.5) * ms:.1f} ms p99 {percentile(base, 0.99) * ms:.1f} ms | "
            f"proxied p50 {percentile(via, 0.5) * ms:.1f} ms p99 {percentile(via, 0.99) * ms:.1f} ms | added "
            f"p50 {(percentile(via, 0.5) - percentile(base, 0.5)) * ms:.1f} ms "
            f"p99 {(percentile(via, 0.99) - percentile(base, 0.99)) * ms:.1f} ms"
        )
    if proxied.total:
        print(f"mean total through the proxy {statistics.fmean(proxied.total) * ms:.1f} ms")
    change = (rss_after - rss_start) / rss_start
    print(f"proxy RSS: start {rss_start / 1024:.1f} MB, peak {peak[0] / 1024:.1f} MB, "
          f"after {rss_after / 1024:.1f} MB ({change:+.1%} vs start), "
          f"after the load sessions are evicted {rss_evicted / 1024:.1f} MB")  # fmt: skip
    print(f"proxy RSS during the load (MB): {rss_marks(timeline)}")
    print(f"eviction (oldest idle first): {'ok' if evicted_ok else 'FAILED'} ({evicted_note})")
    checks = {
        "zero errors": not proxied.errors,
        "RSS back within 10%": abs(change) <= 0.10,
        "eviction order": evicted_ok,
        "proxy alive": alive,
    }
    print("checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in checks.items()))
    if not all(checks.values()):
        print("proxy log tail:\n" + log_tail)
    return 0 if all(checks.values()) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--direct-seconds", type=float, default=5, help="baseline phase straight to the simulator")
    parser.add_argument("--settle-seconds", type=float, default=5, help="idle time before the 'after' RSS")
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--max-sessions", type=int, default=50)
    return parser.parse_args(argv)


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parent.parent)
    sys.exit(asyncio.run(main(parse_args())))
