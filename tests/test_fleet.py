"""One view of the fleet: proxies that share a Redis (one server, or a real three-node Redis Cluster) each show
every instance's sessions on `/sessions` and `/sessions/{id}`, and on a cluster serve as one proxy would."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import redis

from proxy.demo.simulator import SIMULATOR, start_simulator
from tests.harness import closed_port
from tests.redis_server import REDIS_CLI, REDIS_SERVER, RedisCluster, RedisServer
from tests.test_state_redis import Proxy, ask, reference, turns, wait_healthy, write_config

__all__ = ["reference"]  # a fixture this module uses (redis_server is conftest's)

pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed (.ci/run installs it)")


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    if REDIS_CLI is None:
        pytest.skip("redis-cli is not installed (Debian's redis-tools, beside redis-server)")
    cluster = RedisCluster(tmp_path / "cluster")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def cluster_config(folder: Path, upstream: str, cluster: RedisCluster) -> Path:
    path = write_config(folder, upstream, cluster.url)
    path.write_text(path.read_text() + "redis_cluster = true\n")  # [state] is the file's last table
    return path


async def get(port: int, path: str) -> Any:
    async with aiohttp.ClientSession() as client, client.get(f"http://127.0.0.1:{port}{path}") as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def eventually(check: Callable[[], Any], within_s: float = 10.0) -> Any:
    """`check()`'s first truthy answer: the fleet index is written in batches, at most a second apart."""
    deadline = time.monotonic() + within_s
    while True:
        if answer := await check():
            return answer
        assert time.monotonic() < deadline, "the fleet view never showed it"
        await asyncio.sleep(0.1)


def first_turns(count: int) -> list[tuple[list, Any]]:
    return [(messages, tools) for _s, _k, messages, tools in list(turns())[:count]]


async def test_each_instance_lists_and_shows_the_sessions_the_others_served(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    sim, url = await start_simulator()
    config = write_config(tmp_path / "fleet", url, redis_server.url)
    try:
        async with Proxy(config) as a, Proxy(config) as b:
            for messages, tools in first_turns(3):
                await ask(a.port, "served-by-a", messages, tools)
            for messages, tools in first_turns(2):
                await ask(b.port, "served-by-b", messages, tools)

            async def both_listed(port: int) -> dict[str, int] | None:
                rows = {row["id"]: row["turns"] for row in await get(port, "/sessions")}
                return rows if rows == {"served-by-a": 3, "served-by-b": 2} else None

            assert await eventually(lambda: both_listed(a.port))
            assert await eventually(lambda: both_listed(b.port))
            on_a, on_b = await get(a.port, "/sessions/served-by-b"), await get(b.port, "/sessions/served-by-b")
            assert on_a["turns"] == on_b["turns"] == 2
            after = [[t["tokens_after"] for t in shown["turn_details"]] for shown in (on_a, on_b)]
            assert after[0] == after[1] and len(after[0]) == 2
            assert on_a["cost_usd"] == pytest.approx(on_b["cost_usd"]) and on_a["cost_usd"] > 0
            assert on_a["epochs"] == on_b["epochs"]

            # B goes on with A's session: A's own copy is now behind, and A shows B's turn all the same.
            for messages, tools in first_turns(4)[3:]:
                await ask(b.port, "served-by-a", messages, tools)
            shown = await get(a.port, "/sessions/served-by-a")
            assert shown["turns"] == 4 and len(shown["turn_details"]) == 4
    finally:
        await sim.cleanup()


async def test_two_proxies_on_a_three_node_cluster_send_what_one_proxy_sends(
    tmp_path: Path, redis_cluster: RedisCluster, reference: list[bytes]
) -> None:
    sim, url = await start_simulator()
    config = cluster_config(tmp_path / "cluster-pair", url, redis_cluster)
    sessions: set[str] = set()
    try:
        async with Proxy(config) as a, Proxy(config) as b:
            for i, (session, _k, messages, tools) in enumerate(turns()):
                await ask((a, b)[i % 2].port, session, messages, tools)
                sessions.add(session)
            sent = [r.raw for r in sim.app[SIMULATOR].requests]
            rows = await eventually(lambda: _listed(a.port, len(sessions)))
            assert {row["id"] for row in rows} == sessions
            for session in sessions:
                on_a, on_b = await get(a.port, f"/sessions/{session}"), await get(b.port, f"/sessions/{session}")
                assert on_a["turns"] == on_b["turns"] > 0
    finally:
        await sim.cleanup()
    assert sent == reference
    # Each session's two keys (its hash, its turn details) share a hash tag, so one node holds both.
    nodes_of: dict[str, set[int]] = {}
    shared = set()
    for i, node in enumerate(redis_cluster.nodes):
        with redis.Redis(port=node.port) as client:
            for key in (k.decode() for k in client.scan_iter("context-proxy:*")):
                if "{" in key:
                    nodes_of.setdefault(key[key.index("{") : key.index("}") + 1], set()).add(i)
                else:
                    shared.add(key)
    assert {tag.split("@")[0].strip("{") for tag in nodes_of} == sessions
    assert all(len(nodes) == 1 for nodes in nodes_of.values()), nodes_of
    assert shared == {"context-proxy:calibration", "context-proxy:sessions"}


async def _listed(port: int, count: int) -> list[dict] | None:
    rows = await get(port, "/sessions")
    return rows if len(rows) == count else None


async def test_a_client_that_hangs_up_once_it_has_its_answer_is_answered_and_its_costs_reach_the_fleet(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Each JSON answer is read whole, then the connection closed at once: aiohttp cancels the handler of the
    proxy (`serve`, its own process, so the hang-up races the handler's last write as it would in use)."""
    sim, url = await start_simulator()
    config, port = write_config(tmp_path / "hang-up", url, redis_server.url), closed_port()
    served = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port)])
    body = {"model": "sim-12k", "messages": [{"role": "user", "content": "hi"}]}
    try:
        await wait_healthy(port)
        for _ in range(30):
            async with (
                aiohttp.ClientSession() as client,
                client.post(f"http://127.0.0.1:{port}/s/hang-up/v1/chat/completions", json=body) as response,
            ):
                assert (await response.json())["choices"]
        async with aiohttp.ClientSession() as client, client.get(f"http://127.0.0.1:{port}/metrics") as response:
            counted = [x for x in (await response.text()).splitlines() if x.startswith(CHAT_REQUESTS)]
        assert counted == [CHAT_REQUESTS + 'status="200"} 30']  # answered, each of them: never a 499
        async with Proxy(config) as other:
            shown = await eventually(lambda: _shown_with(other.port, "hang-up", 30))
        assert all(t["prompt_tokens"] and t["cost_usd"] for t in shown["turn_details"])
    finally:
        served.terminate()
        served.wait(timeout=30)
        await sim.cleanup()


CHAT_REQUESTS = 'context_proxy_requests_total{route="chat_completions",'


async def _shown_with(port: int, session: str, turns: int) -> dict | None:
    async with aiohttp.ClientSession() as client, client.get(f"http://127.0.0.1:{port}/sessions/{session}") as got:
        shown = await got.json() if got.status == 200 else None
    return shown if shown and len(shown["turn_details"]) == turns else None


class SlowLink:
    """A TCP relay to Redis on 127.0.0.1 that holds what its client sends for `delay_s` (a far-away network):
    the process behind it writes to Redis that much after it has sent its request."""

    def __init__(self, target_port: int, delay_s: float) -> None:
        self.target_port, self.delay_s = target_port, delay_s
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        for pipe in (self._pipe(reader, upstream_writer, self.delay_s), self._pipe(upstream_reader, writer, 0.0)):
            task = asyncio.create_task(pipe)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
        try:
            while data := await reader.read(65536):
                if delay_s:
                    await asyncio.sleep(delay_s)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:
            self.server.close()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "json"])
async def test_a_previous_response_id_chain_stays_one_session_across_two_proxy_processes(
    tmp_path: Path, redis_server: RedisServer, stream: bool
) -> None:
    """Codex continues a Responses chain by `previous_response_id` alone: each link may reach another instance
    (here two `serve` processes on one Redis), and every link must land in the session the chain started in.
    A's Redis is 80 ms away, so a link's answer must not be complete at the client before A has written where
    the chain goes: the client sends the next link to B at once (a JSON answer, sent with its length, was
    complete before A's write)."""
    sim, url = await start_simulator()
    slow = SlowLink(redis_server.port, delay_s=0.08)
    slow_url = f"redis://127.0.0.1:{await slow.start()}/0"
    configs = [write_config(tmp_path / name, url, redis) for name, redis in (("a", slow_url), ("b", redis_server.url))]
    configs[0].write_text(configs[0].read_text().replace("redis_timeout_ms = 500", "redis_timeout_ms = 3000"))
    ports = [closed_port(), closed_port()]
    served = [
        subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port)])
        for config, port in zip(configs, ports, strict=True)
    ]
    try:
        for port in ports:
            await wait_healthy(port)
        previous: str | None = None
        for link in range(4):  # A, B, A, B: each link on the other process
            base = f"http://127.0.0.1:{ports[link % 2]}/v1"
            async with openai.AsyncOpenAI(base_url=base, api_key="sk-chain", max_retries=0) as sdk:
                extra = {"previous_response_id": previous} if previous else {}
                if stream:
                    answer = await sdk.responses.create(model="sim-12k", input=f"Step {link}.", stream=True, **extra)
                    done = [event async for event in answer if event.type == "response.completed"]
                    previous = done[0].response.id
                else:
                    previous = (await sdk.responses.create(model="sim-12k", input=f"Step {link}.", **extra)).id

        async def one_session(port: int) -> list[dict] | None:
            rows = await get(port, "/sessions")
            return rows if sum(row["turns"] for row in rows) == 4 else None

        rows = await eventually(lambda: one_session(ports[1]))  # B reads Redis without A's delay
        assert [row["turns"] for row in rows] == [4], rows
        shown = await get(ports[0], f"/sessions/{rows[0]['id']}")  # B served last: A shows the shared record
        assert [t["unedited"] for t in shown["turn_details"]] == [None] + ["previous_response_id"] * 3
        assert all(t["prompt_tokens"] for t in shown["turn_details"])
    finally:
        for process in served:
            process.terminate()
            process.wait(timeout=30)
        await slow.close()
        await sim.cleanup()
