"""No request holds the event loop or another session (#29 items 1, 2, 4), observed from outside.

Each test sends a turn whose engine work takes a while (megabytes of distinct text to count) and
watches what else the proxy answers meanwhile: `/healthz` polled back to back, another session's
turn. The windows are bounded by events (a request sent, a response or an upstream arrival), not by
wall-clock thresholds; how long things take is `python -m bench stall`'s to measure.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.context.policy import ModelInfo
from tests.harness import ChatUpstream

BIG_MODEL = "big-window"  # a model whose window holds the big conversation, so the engine does all its work
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma", "omega", "tau"]


def big_conversation(megabytes: float, salt: str) -> list[dict[str, Any]]:
    """Distinct text (no count is cached), in messages of ~2 KB: the engine counts and journals it all."""
    rnd = random.Random(salt)
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are {salt}."}]
    size = 0
    while size < megabytes * 1024 * 1024:
        text = " ".join(f"{rnd.choice(WORDS)}{rnd.randint(0, 99999)}" for _ in range(220))
        messages.append({"role": "user" if len(messages) % 2 else "assistant", "content": text})
        size += len(text)
    messages.append({"role": "user", "content": "Sum it up."})
    return messages


class Watch:
    """/healthz polled back to back; `answered(a, b)`: how many answers came between two instants."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.times: list[float] = []
        self._task = asyncio.create_task(self._poll(http, url))

    async def _poll(self, http: aiohttp.ClientSession, url: str) -> None:
        while True:
            async with http.get(url) as response:
                await response.read()
            self.times.append(time.monotonic())

    def answered(self, start: float, end: float) -> int:
        return sum(start < t < end for t in self.times)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def _timed(call: Awaitable[Any]) -> float:
    await call
    return time.monotonic()


async def _post(http: aiohttp.ClientSession, url: str, body: dict, session: str, key: str = "sk-a") -> int:
    headers = {"Authorization": f"Bearer {key}", "X-Session-Id": session, "Content-Type": "application/json"}
    async with http.post(url, data=orjson.dumps(body), headers=headers) as response:
        await response.read()
        return response.status


class Upstream(ChatUpstream):
    """A bare upstream on 127.0.0.1: notes when each request's head came (the proxy's engine work is done by
    then), drains the body, answers a fixed completion, or `refuse_first` a context_length_exceeded."""

    def __init__(self, refuse_first: str = "") -> None:
        super().__init__()
        self.arrivals: list[tuple[str, float, int]] = []  # (session, when its head came, its Content-Length)
        self.refused: list[float] = []
        self.refuse_first = refuse_first

    def came(self, session: str) -> list[float]:
        return [when for name, when, _ in self.arrivals if name == session]

    def sizes(self, session: str) -> list[int]:
        return [size for name, _, size in self.arrivals if name == session]

    async def answer(self, request: web.Request) -> web.Response:
        self.arrivals.append((request.headers.get("X-Session-Id", ""), time.monotonic(), request.content_length or 0))
        await request.read()
        if self.refuse_first and len(self.arrivals) == 1:
            self.refused.append(time.monotonic())
            error = {"message": self.refuse_first, "type": "invalid_request_error", "param": "messages"}
            return web.json_response({"error": {**error, "code": "context_length_exceeded"}}, status=400)
        return web.json_response({"id": "x", "object": "chat.completion", "choices": [], "model": BIG_MODEL})


async def _big_window_rig(make_rig: Any, window: int = 50_000_000, **kwargs: Any) -> Any:
    rig = await make_rig(engine=True, server={"max_body_mb": 64, "body_budget_mb": 256}, **kwargs)
    settings = rig.holder.settings
    rig.holder.settings = replace(settings, models=(ModelInfo(pattern=BIG_MODEL, context_window=window),))
    return rig


async def test_a_small_turn_waiting_for_its_sessions_big_turn_never_holds_the_loop_or_other_sessions(make_rig):
    """#1: the small turn of a session whose big turn is in the engine awaits it; everyone else goes on.

    The small turn is sent once the big one should hold its session (its body up and parsed). On a loaded
    machine that can take longer than the wait, and the small turn then goes first and proves nothing: the
    scenario is run again, on a new session, with a longer wait.
    """
    upstream = Upstream()
    rig = await _big_window_rig(make_rig, upstream_url=await upstream.start())
    url = rig.base_url + "/chat/completions"
    small = {"model": BIG_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with aiohttp.ClientSession() as http:
            for attempt, wait in enumerate((1.0, 3.0, 8.0)):
                shared, elsewhere = f"shared-{attempt}", f"elsewhere-{attempt}"
                await _post(http, url, small, shared)  # the session exists: the big turn is one of its later turns
                watch = Watch(http, f"http://127.0.0.1:{rig.port}/healthz")
                big_body = {"model": BIG_MODEL, "messages": big_conversation(12, f"x{attempt}")}
                big = asyncio.create_task(_post(http, url, big_body, shared))
                await asyncio.sleep(wait)  # its body is up and parsed (~0.3 s quiet): the engine holds the session
                assert len(upstream.came(shared)) == 1, "the big turn was through before the test could watch it"
                sent = time.monotonic()
                same = asyncio.create_task(_post(http, url, small, shared))
                await asyncio.sleep(0.05)
                await _post(http, url, small, elsewhere, key="sk-b")
                await asyncio.gather(big, same)
                await watch.stop()
                if upstream.sizes(shared)[1] > upstream.sizes(shared)[2]:
                    break  # the big turn held the session when the small one came
            else:
                raise AssertionError("the big turn never held its session before the small turn came")
    finally:
        await upstream.runner.cleanup()
    big_through = upstream.came(shared)[1]  # the big turn's engine work ended just before
    assert watch.answered(sent, big_through) >= 3, "the loop stopped while a turn waited for its session"
    assert upstream.came(elsewhere)[0] < big_through, "another session's turn waited for the big one"
    assert upstream.came(shared)[2] > big_through, "the session's small turn went before its big one"


async def test_a_refit_after_an_upstream_overflow_never_holds_the_loop(make_rig):
    """#2: the re-fit of a big turn (the upstream said context_length_exceeded) runs off the loop."""
    upstream = Upstream(
        refuse_first="This model's maximum context length is 5000000 tokens. However, you requested 8000000 "
        "tokens (8000000 in the messages, 0 in the completion). Please reduce the length of the messages."
    )
    try:
        # ~3.7M tokens by our count: under the window's high water; twice that (the most a refit believes) is not
        rig = await _big_window_rig(make_rig, window=5_000_000, upstream_url=await upstream.start())
        async with aiohttp.ClientSession() as http:
            watch = Watch(http, f"http://127.0.0.1:{rig.port}/healthz")
            body = {"model": BIG_MODEL, "messages": big_conversation(12, "refit")}
            status = await _post(http, rig.base_url + "/chat/completions", body, "refit")
            await watch.stop()
    finally:
        await upstream.runner.cleanup()
    assert status == 200 and len(upstream.arrivals) == 2, "the turn was not re-fitted and retried"
    refitted = upstream.arrivals[1][1]  # the retry's head: the re-fit was done
    assert watch.answered(upstream.refused[0], refitted) >= 3, "the loop stopped while the turn was re-fitted"


async def test_a_huge_body_does_not_queue_another_clients_big_turn_behind_it(make_rig):
    """#4: two clients' big bodies are prepared side by side, not one after the other."""
    rig = await _big_window_rig(make_rig)
    url = rig.base_url + "/chat/completions"
    huge = {"model": BIG_MODEL, "messages": big_conversation(16, "huge")}
    victim = {"model": BIG_MODEL, "messages": big_conversation(0.5, "victim")}
    async with aiohttp.ClientSession() as http:
        huge_done = asyncio.create_task(_timed(_post(http, url, huge, "attacker", key="sk-attacker")))
        await asyncio.sleep(0.3)
        assert not huge_done.done(), "the huge turn ended before the test could watch it: make it bigger"
        victim_done = await _timed(_post(http, url, victim, "victim", key="sk-victim"))
        end = await huge_done
    assert victim_done < end, "the victim's turn waited for the whole huge one"
