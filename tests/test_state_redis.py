"""Two proxies on one real Redis serve one conversation as one proxy would, through races, crashes and outages.

Each test replays the packaged traces' first turns with the official `openai` SDK, alternating
between two proxies that share a `redis-server` the test starts, and compares the exact bytes
the upstream (the simulator) received with what a single in-memory proxy sends for the same turns.
A 12k window makes the engine edit (clear, truncate) within those first turns.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
import pytest_asyncio
import redis

from proxy.config.loader import ConfigHolder, load_settings
from proxy.demo.simulator import SIMULATOR, start_simulator
from proxy.demo.traces import list_traces, load_trace, requests
from proxy.service.engine_service import build_context_service
from proxy.shell.app_keys import CONTEXT
from proxy.shell.server import start
from proxy.state.redis_keys import CALIBRATION_KEY
from tests.harness import closed_port, settle
from tests.redis_server import REDIS_SERVER, RedisServer

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed (.ci/run installs it)")

MODEL = "sim-12k"
TURNS = 14  # per trace

CONFIG = """
[upstream]
base_url = "{upstream}"
read_timeout_s = 30

[models."sim-*"]
context_window = 12000
encoding = "o200k_base"
input_per_mtok = 2.50
cached_input_per_mtok = 1.25

[policy]
reserve_output_tokens = 1000

[state]
redis_url = "{redis}"
redis_timeout_ms = 500
redis_retry_s = 0.2
"""


def write_config(folder: Path, upstream: str, redis_url: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "proxy.toml"
    text = CONFIG.format(upstream=upstream, redis=redis_url)
    path.write_text(text if redis_url else text.split("[state]")[0])
    return path


class Proxy:
    """A proxy served in this process (`start`) from a config file."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.runner: Any = None
        self.port = 0

    async def __aenter__(self) -> Proxy:
        holder = ConfigHolder(load_settings(self.config))
        self.runner, self.port = await start(holder, "127.0.0.1", 0, context=build_context_service(holder))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


def turns() -> Iterator[tuple[str, int, list[dict[str, Any]], Any]]:
    """(session, turn, messages, tools) for the first TURNS turns of every packaged trace, trace after trace."""
    for name in list_traces():
        trace = load_trace(name)
        for k, (messages, _answer) in enumerate(requests(trace)):
            if k == TURNS:
                break
            yield f"trace-{name}", k, messages, trace.tools


async def ask(port: int, session: str, messages: list, tools: Any, **headers: str) -> dict[str, str]:
    """One streamed turn through the SDK; its X-Context headers."""
    base = f"http://127.0.0.1:{port}/s/{session}/v1"
    extra = {"tools": tools} if tools else {}
    async with openai.AsyncOpenAI(base_url=base, api_key="sk-redis-test", max_retries=0) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, stream=True, extra_headers=headers or None, **extra
        )
        assert [chunk async for chunk in raw.parse()]
        return dict(raw.headers)


@pytest_asyncio.fixture
async def reference(tmp_path: Path) -> AsyncIterator[list[bytes]]:
    """What one in-memory proxy sends upstream for `turns()`: the bodies, byte for byte."""
    sim, url = await start_simulator()
    epochs = 0
    try:
        async with Proxy(write_config(tmp_path / "reference", url)) as proxy:
            for session, _k, messages, tools in turns():
                headers = await ask(proxy.port, session, messages, tools)
                epochs += headers["x-context-epoch"] == "1"
        assert epochs >= 2, "the replay must make the engine edit, or the comparison proves little"
        yield [r.raw for r in sim.app[SIMULATOR].requests]
    finally:
        await sim.cleanup()


async def health(port: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as client, client.get(f"http://127.0.0.1:{port}/healthz") as response:
        return await response.json()


async def test_two_proxies_alternating_turns_send_what_one_proxy_sends(
    tmp_path: Path, redis_server: RedisServer, reference: list[bytes]
) -> None:
    sim, url = await start_simulator()
    config = write_config(tmp_path / "pair", url, redis_server.url)
    try:
        async with Proxy(config) as a, Proxy(config) as b:
            for n, (session, _k, messages, tools) in enumerate(turns()):
                await ask((a, b)[n % 2].port, session, messages, tools)
        sent = [r.raw for r in sim.app[SIMULATOR].requests]
    finally:
        await sim.cleanup()
    assert len(sent) == len(reference)
    for n, (mine, theirs) in enumerate(zip(sent, reference, strict=True)):
        assert mine == theirs, f"request {n + 1} differs from the single proxy's"


async def test_two_concurrent_turns_of_one_session_on_two_proxies_keep_one_journal(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Turns k and k+1 of one conversation reach two proxies at once: neither is lost, and the next turn
    continues the later one's request byte for byte (one journal, not two)."""
    sim, url = await start_simulator()
    config = write_config(tmp_path / "pair", url, redis_server.url)
    history = [t for t in turns() if t[0] == f"trace-{list_traces()[0]}"]
    stored = redis.Redis.from_url(redis_server.url)
    recorded = sim.app[SIMULATOR].requests
    try:
        async with Proxy(config) as a, Proxy(config) as b:
            for k in range(0, len(history) - 2, 2):
                (session, _, earlier, tools), (_, _, later, _) = history[k], history[k + 1]
                await asyncio.gather(ask(a.port, session, earlier, tools), ask(b.port, session, later, tools))
                (key,) = stored.keys("context-proxy:session:*")
                journal = orjson.loads(stored.hget(key, "s"))["journal"]
                assert len(journal["tokens"]) == len(later), f"turn {k + 2} lost from the journal"
                sent_later = next(
                    r.body["messages"] for r in list(recorded)[-2:] if r.body["messages"][-1] == later[-1]
                )
                (_, _, following, _) = history[k + 2]
                headers = await ask((a, b)[k // 2 % 2].port, session, following, tools)
                if headers["x-context-epoch"] == "0":
                    mine = recorded[-1].body["messages"]
                    assert mine[: len(sent_later)] == sent_later, f"turn {k + 3} forked from turn {k + 2}"
    finally:
        await sim.cleanup()
        stored.close()


def spawn_proxy(config: Path, port: int) -> subprocess.Popen:
    args = [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port)]
    return subprocess.Popen([*args, "--log-level", "WARNING"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def wait_healthy(port: int) -> None:
    for _ in range(600):
        try:
            await health(port)
            return
        except aiohttp.ClientError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"no proxy answered on port {port}")


async def test_a_proxy_killed_mid_turn_changes_nothing_the_upstream_sees(
    tmp_path: Path, redis_server: RedisServer, reference: list[bytes]
) -> None:
    sim, url = await start_simulator()
    config = write_config(tmp_path / "pair", url, redis_server.url)
    ports = [closed_port(), closed_port()]
    procs = [spawn_proxy(config, port) for port in ports]
    kill_at = TURNS + 5  # a turn of the second trace, on the second proxy
    interrupted = None
    try:
        for port in ports:
            await wait_healthy(port)
        recorded = sim.app[SIMULATOR].requests
        for n, (session, _k, messages, tools) in enumerate(turns()):
            if n == kill_at:
                slow = asyncio.create_task(ask(ports[1], session, messages, tools, **{"X-Sim-Delay-Ms": "200"}))
                assert await settle(lambda: len(recorded) == kill_at + 1, timeout=20)
                procs[1].kill()  # SIGKILL while the answer streams
                with pytest.raises(openai.APIError):
                    await slow
                interrupted = n
                await ask(ports[0], session, messages, tools)  # the client retries on the other instance
                procs[1] = spawn_proxy(config, ports[1])
                await wait_healthy(ports[1])
                continue
            await ask(ports[n % 2], session, messages, tools)
        sent = [r.raw for r in recorded]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
        await sim.cleanup()
    assert interrupted is not None
    assert sent[interrupted] == reference[interrupted]  # the request in flight when its proxy died
    retried = sent[:interrupted] + sent[interrupted + 1 :]
    assert len(retried) == len(reference)
    for n, (mine, theirs) in enumerate(zip(retried, reference, strict=True)):
        assert mine == theirs, f"request {n + 1} differs from the single proxy's"


async def test_with_redis_away_every_turn_is_answered_and_sharing_resumes_when_it_returns(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    sim, url = await start_simulator()
    config = write_config(tmp_path / "pair", url, redis_server.url)
    trace = load_trace(list_traces()[0])
    history = [(messages, trace.tools) for messages, _ in requests(trace)][:TURNS]
    session = "outage"
    headers: list[dict[str, str]] = []
    try:
        async with Proxy(config) as a, Proxy(config) as b:
            proxies = (a, b)
            for n, (messages, tools) in enumerate(history):
                if n == 4:
                    redis_server.stop()
                if n == 8:
                    degraded = [await health(p.port) for p in proxies]
                    assert all(h["state"] == "degraded" and "Redis" in h["state_error"] for h in degraded), degraded
                    assert all(h["status"] == "ok" for h in degraded)
                    redis_server.start()  # empty: what it held is gone
                    await asyncio.sleep(0.3)  # past redis_retry_s
                headers.append(await ask(proxies[n % 2].port, session, messages, tools))
            assert [(await health(p.port))["state"] for p in proxies] == ["ok", "ok"]
        sent = [r.body["messages"] for r in sim.app[SIMULATOR].requests]
    finally:
        await sim.cleanup()
    assert len(sent) == len(history)  # every turn was answered (ask() asserts a whole stream)
    stored = redis.Redis.from_url(redis_server.url)
    try:
        keys = stored.keys("context-proxy:session:{outage*")
        assert len(keys) == 1 and stored.hget(keys[0], "s")
    finally:
        stored.close()
    # Shared again: from the second turn after Redis came back, each instance continues the other's
    # request byte for byte (its cached prefix), except where an epoch edits it.
    for n in range(10, len(sent)):
        if headers[n]["x-context-epoch"] == "0":
            assert sent[n][: len(sent[n - 1])] == sent[n - 1], f"turn {n + 1} forked from turn {n}"
    assert any(int(h["x-context-tokens-after"]) < int(h["x-context-tokens-before"]) for h in headers[9:])


async def test_a_redis_that_stops_answering_delays_no_turn_for_long(tmp_path: Path, redis_server: RedisServer) -> None:
    """Redis frozen (SIGSTOP: connections open, nothing answered): each call gives up after redis_timeout_ms."""
    sim, url = await start_simulator()
    config = write_config(tmp_path / "pair", url, redis_server.url)
    trace = load_trace(list_traces()[0])
    history = [(messages, trace.tools) for messages, _ in requests(trace)][:8]
    assert redis_server.process is not None
    try:
        async with Proxy(config) as a:
            for n, (messages, tools) in enumerate(history):
                if n == 2:
                    redis_server.process.send_signal(signal.SIGSTOP)
                if n == 6:
                    state = await health(a.port)
                    assert state["state"] == "degraded" and "Timeout" in state["state_error"], state
                    redis_server.process.send_signal(signal.SIGCONT)
                    await asyncio.sleep(0.3)  # past redis_retry_s
                async with asyncio.timeout(20):  # a stalled turn would hang here for good
                    await ask(a.port, "frozen", messages, tools)
            assert (await health(a.port))["state"] == "ok"
    finally:
        if redis_server.process is not None:
            redis_server.process.send_signal(signal.SIGCONT)
        await sim.cleanup()
    assert len(sim.app[SIMULATOR].requests) == len(history)


async def test_the_shared_calibration_learns_only_listed_models_at_most_a_cap_and_expires(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Clients name any models they like (#29 item 11: 1,500 names made 1,444 fields, no TTL): only names a
    [models] entry lists reach the shared hash, at most `max_models_shared` of them, and the hash expires."""
    sim, url = await start_simulator()
    config = write_config(tmp_path / "names", url, redis_server.url)
    text = " ".join(f"word{k}" for k in range(400))  # over the size from which a turn teaches the ratio
    try:
        async with Proxy(config) as proxy, aiohttp.ClientSession() as http:
            store = proxy.runner.app[CONTEXT].store
            store.max_models_shared = 4
            for k in range(12):
                for model in (f"sim-listed-{k}", f"unlisted-{k}"):
                    body = {"model": model, "messages": [{"role": "user", "content": f"{k} {text}"}]}
                    headers = {"Authorization": "Bearer sk-names", "X-Session-Id": f"s-{model}"}
                    async with http.post(
                        f"http://127.0.0.1:{proxy.port}/v1/chat/completions", json=body, headers=headers
                    ) as r:
                        assert r.status == 200
    finally:
        await sim.cleanup()
    shared = redis.Redis.from_url(redis_server.url)
    fields = {name.decode() for name in shared.hkeys(CALIBRATION_KEY)}
    assert fields == {f"sim-listed-{k}" for k in range(4)}
    assert 0 < shared.pttl(CALIBRATION_KEY) <= 6 * 3600 * 1000


async def _row(port: int, session: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as client, client.get(f"http://127.0.0.1:{port}/sessions/{session}") as r:
        return await r.json()


async def test_two_proxies_count_a_sessions_totals_as_one_proxy_does(tmp_path: Path, redis_server: RedisServer) -> None:
    first = next(turns())[0]
    session_turns = [t for t in turns() if t[0] == first]
    rows = []
    for name, redis_url in (("one", ""), ("pair", redis_server.url)):
        sim, url = await start_simulator()
        try:
            async with Proxy(write_config(tmp_path / name, url, redis_url)) as a, Proxy(a.config) as b:
                proxies = (a, b) if redis_url else (a, a)
                for n, (session, _k, messages, tools) in enumerate(session_turns):
                    await ask(proxies[n % 2].port, session, messages, tools)
                rows.append(await _row(proxies[(len(session_turns) - 1) % 2].port, first))
        finally:
            await sim.cleanup()
    one, pair = rows
    counted = ("turns", "tokens_before_total", "tokens_after_total", "billed_tokens", "billed_cached_tokens")
    assert {k: pair[k] for k in (*counted, "overflows_rescued", "epochs")} == {
        k: one[k] for k in (*counted, "overflows_rescued", "epochs")
    }
    assert one["epochs"] >= 1 and one["billed_cached_tokens"] > 0
    assert pair["saved_usd"] == pytest.approx(one["saved_usd"]) and pair["cost_usd"] == pytest.approx(one["cost_usd"])
