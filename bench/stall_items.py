"""Issue 29's stalls, one figure per item, the working tree against an earlier commit:
`python -m bench stall-items [--ref REV]`.

Each revision runs as a real `context-proxy serve` (`python -m proxy serve`, from that revision's own tree,
its packaged proxy.toml with the lines below changed where it has them) in front of a bare upstream in this
process. `/healthz` is polled every 20 ms all the while. What a client sees:

- 1: a session's 12 MB turn, and small turns of the same session every 0.25 s until it is answered: the
  longest `/healthz` wait.
- 2: a 12 MB turn the upstream refuses once with context_length_exceeded (the proxy re-fits and retries):
  the longest `/healthz` wait.
- 3: a 6 MB body, one assistant message calling ~22,000 tools, their results after it in reverse order: the
  turn's time; another client's 400 KB turn sent meanwhile, and a like one (other text: no count cached) alone.
- 4: 12 MB of tiny messages from one client; another client's 0.5 MB conversation sent meanwhile, and a like one alone.
- 13: a session whose rule carries a 20 MB capsule: the median of its warm turns 2 to 4, and the longest
  `/healthz` wait over its 4 turns.
- 5 (a count): 6 idle WebSockets at `max_connections` 6, every timeout the revision has at 1 s: how many are
  still open 3 s later, and what a new client gets.
- 6 (a count): then, on the same proxy (`memory_mb` 8 where the revision has the key), 8 sessions of 20,000
  small messages one after another: how many sessions `/sessions` lists after, and the proxy's RSS growth.
"""

from __future__ import annotations

import asyncio
import random
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from bench.procs import ROOT, Server, serve_config, tree_at
from tests.harness import ChatUpstream

BIG_MODEL = "big-window"  # holds every conversation here, so the engine does all its work
REFIT_MODEL = "refit-window"
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma", "omega", "tau"]
REFIT_WINDOW = 5_000_000  # a 12 MB turn fits our count (~3.7M), the upstream's stated 8M does not


def refusal(window: int) -> str:
    """OpenAI's context_length_exceeded message for a prompt 1.6 times `window`."""
    asked = window * 8 // 5
    return (
        f"This model's maximum context length is {window} tokens. However, you requested {asked} tokens "
        f"({asked} in the messages, 0 in the completion). Please reduce the length of the messages."
    )


def models(refit_window: int) -> str:
    return f"""
[models."{BIG_MODEL}"]
context_window = 50000000
encoding = "o200k_base"

[models."{REFIT_MODEL}"]
context_window = {refit_window}
encoding = "o200k_base"
"""


# [server] lines set where the revision's packaged config has them (a key it lacks is left out, not added).
SERVER = {"max_body_mb": "64", "body_budget_mb": "256"}
SLOTS = 6
SESSIONS, SESSION_MESSAGES = 8, 20_000  # item 6: ~2.4 MB each in memory, by the 24 MB per 200k messages
SMALL_SERVER = {
    "max_connections": str(SLOTS),
    "header_timeout_s": "1",
    "body_timeout_s": "1",
    "keepalive_timeout_s": "1",
    "websocket_idle_timeout_s": "1",
    "websocket_heartbeat_s": "1",
    "memory_mb": "8",
}


def distinct_text(megabytes: float, salt: str, words: int = 220) -> list[str]:
    """Texts of `words` words (~9 bytes each), none repeated (no count is cached), `megabytes` in all."""
    rnd = random.Random(salt)
    texts, size = [], 0
    while size < megabytes * 1024 * 1024:
        text = " ".join(f"{rnd.choice(WORDS)}{rnd.randint(0, 99999)}" for _ in range(words))
        texts.append(text)
        size += len(text)
    return texts


def conversation(megabytes: float, salt: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are {salt}."}]
    for text in distinct_text(megabytes, salt):
        messages.append({"role": "user" if len(messages) % 2 else "assistant", "content": text})
    messages.append({"role": "user", "content": "Sum it up."})
    return messages


def reversed_results(megabytes: float, salt: str) -> list[dict[str, Any]]:
    """One assistant message calling a tool once per result, the results after it in reverse order (item 3)."""
    outputs = distinct_text(megabytes * 0.6, salt, words=16)  # the calls and the messages' keys are the rest
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        for i in range(len(outputs))
    ]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Read them all."},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    for i in reversed(range(len(outputs))):
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": outputs[i]})
    return messages


def tiny_messages(megabytes: float) -> list[dict[str, Any]]:
    """Item 4's flood: `megabytes` of messages a few bytes each."""
    count = int(megabytes * 1024 * 1024 / 40)
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(count)]


class Upstream(ChatUpstream):
    """Drains each body and answers a small completion; a session named `refit-*` is refused once with
    context_length_exceeded. `/v1/responses` upgraded to a WebSocket stays open until the proxy closes it."""

    def __init__(self, refit_window: int) -> None:
        super().__init__(max_body=256 * 1024 * 1024)
        self.refusal = refusal(refit_window)
        self.refused: set[str] = set()
        self.sockets = 0  # open now
        self.app.router.add_get("/v1/responses", self.socket)

    async def answer(self, request: web.Request) -> web.Response:
        session = request.headers.get("X-Session-Id", "")
        await request.read()
        if session.startswith("refit-") and session not in self.refused:
            self.refused.add(session)
            error = {"message": self.refusal, "type": "invalid_request_error", "param": "messages"}
            return web.json_response({"error": {**error, "code": "context_length_exceeded"}}, status=400)
        usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
        choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        return web.json_response({"id": "x", "object": "chat.completion", "choices": [choice], "usage": usage})

    async def socket(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        self.sockets += 1
        try:
            async for _ in socket:
                pass
        finally:
            self.sockets -= 1
        return socket


class Watch:
    """`/healthz` polled every 20 ms (back to back, the polls would take the GIL from the engine threads of a
    proxy whose loop is free, and not of one whose loop is held); `worst(start, end)`: the longest wait of a
    poll that ended in between."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.polls: list[tuple[float, float]] = []  # (sent, answered)
        self._task = asyncio.create_task(self._poll(http, url))

    async def _poll(self, http: aiohttp.ClientSession, url: str) -> None:
        while True:
            sent = time.monotonic()
            async with http.get(url) as response:
                await response.read()
            self.polls.append((sent, time.monotonic()))
            await asyncio.sleep(0.02)

    def worst(self, start: float, end: float) -> float:
        return max((b - a for a, b in self.polls if start <= b <= end), default=0.0)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def write_config(tree: Path, folder: Path, server: dict[str, str], scale: float = 1, capsule_mb: float = 0) -> Path:
    """`tree`'s packaged proxy.toml with `server`'s lines and the bench's models; a `capsule-*` rule whose
    capsule is `capsule_mb` of text."""
    text = (tree / "proxy" / "data" / "config" / "proxy.toml").read_text()
    for key, value in server.items():
        text = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", text, count=1)
    (folder / "sessions").mkdir(parents=True)
    (folder / "proxy.toml").write_text(text + models(int(REFIT_WINDOW * scale)))
    if capsule_mb:
        capsule = orjson.dumps(" ".join(distinct_text(capsule_mb, "capsule"))).decode()  # a TOML basic string
        rule = f'match = ["capsule-*"]\n\n[[capsules]]\nid = "big"\nkind = "convention"\ntext = {capsule}\n'
        (folder / "sessions" / "capsule.toml").write_text(rule)
    return folder / "proxy.toml"


async def _post(http: aiohttp.ClientSession, url: str, raw: bytes, session: str, key: str = "sk-a") -> float:
    """Seconds until the whole answer came; anything but a 200 ends the bench."""
    headers = {"Authorization": f"Bearer {key}", "X-Session-Id": session, "Content-Type": "application/json"}
    start = time.monotonic()
    async with http.post(url, data=raw, headers=headers) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"{session}: HTTP {response.status}: {(await response.text())[:300]}")
    return time.monotonic() - start


def _body(messages: list[dict[str, Any]], model: str = BIG_MODEL) -> bytes:
    return orjson.dumps({"model": model, "messages": messages})


async def _after(delay: float, call: Any) -> Any:
    await asyncio.sleep(delay)
    return await call


def _bodies(tag: str, scale: float) -> dict[str, bytes]:
    return {
        "small": _body([{"role": "user", "content": "hi"}]),
        "big": _body(conversation(12 * scale, f"big-{tag}")),
        "refit": _body(conversation(12 * scale, f"refit-{tag}"), REFIT_MODEL),
        "pairing": _body(reversed_results(6 * scale, f"pair-{tag}")),
        "alone3": _body(conversation(0.4, f"v3a-{tag}")),  # the victims: distinct text, so no count is cached
        "beside3": _body(conversation(0.4, f"v3b-{tag}")),
        "flood": _body(tiny_messages(12 * scale)),
        "alone4": _body(conversation(0.5, f"v4a-{tag}")),
        "beside4": _body(conversation(0.5, f"v4b-{tag}")),
    }


async def _turns(port: int, tag: str, body: dict[str, bytes]) -> dict[str, Any]:
    """Items 1, 2, 3, 4 and 13, one after the other, against the proxy on `port`."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
        watch = Watch(http, f"http://127.0.0.1:{port}/healthz")
        try:
            await _post(http, url, body["small"], f"one-{tag}")  # the session exists: the big turn is a later one
            start = time.monotonic()
            big_turn = asyncio.create_task(_post(http, url, body["big"], f"one-{tag}"))
            small = []
            while not big_turn.done():  # small turns of the session, so one comes while the big turn holds it
                small.append(await _after(0.25, _post(http, url, body["small"], f"one-{tag}")))
            out["1"] = {"healthz_worst_s": watch.worst(start, time.monotonic()), "big_s": await big_turn}
            out["1"]["small_worst_s"] = max(small)

            start = time.monotonic()
            refit = await _post(http, url, body["refit"], f"refit-{tag}")
            out["2"] = {"healthz_worst_s": watch.worst(start, time.monotonic()), "turn_s": refit}

            alone = await _post(http, url, body["alone3"], f"v3a-{tag}", key="sk-v")
            turn = asyncio.create_task(_post(http, url, body["pairing"], f"pair-{tag}", key="sk-p"))
            beside = await _after(0.3, _post(http, url, body["beside3"], f"v3b-{tag}", key="sk-v"))
            out["3"] = {"turn_s": await turn, "victim_s": beside, "victim_alone_s": alone}

            alone = await _post(http, url, body["alone4"], f"v4a-{tag}", key="sk-v")
            flood = asyncio.create_task(_post(http, url, body["flood"], f"flood-{tag}", key="sk-f"))
            beside = await _after(0.3, _post(http, url, body["beside4"], f"v4b-{tag}", key="sk-v"))
            out["4"] = {"victim_s": beside, "victim_alone_s": alone, "flood_s": await flood}

            turns, start = [], time.monotonic()
            for k in range(4):
                messages = [{"role": "user", "content": "Run the tests."}]
                messages += [{"role": "user" if i % 2 else "assistant", "content": f"step {i}"} for i in range(k)]
                turns.append(await _post(http, url, _body(messages), f"capsule-{tag}"))
            out["13"] = {"warm_turn_s": statistics.median(turns[1:]), "first_turn_s": turns[0]}
            out["13"]["healthz_worst_s"] = watch.worst(start, time.monotonic())
        finally:
            await watch.stop()
    return out


async def _idle_sockets(port: int, upstream: Upstream) -> dict[str, Any]:
    """Item 5: every slot taken by an idle WebSocket whose client reads (and so answers a close); how many are
    open 3 s on, and a new client's status."""
    async with aiohttp.ClientSession() as http:
        sockets = [await http.ws_connect(f"http://127.0.0.1:{port}/v1/responses") for _ in range(SLOTS)]
        opened = upstream.sockets
        readers = [asyncio.create_task(_read_all(socket)) for socket in sockets]
        await asyncio.sleep(3.0)
        out = {"opened": opened, "open_after_3s": sum(not r.done() for r in readers), "upstream_open": upstream.sockets}
        try:
            async with aiohttp.ClientSession() as fresh, fresh.get(f"http://127.0.0.1:{port}/healthz") as response:
                out["new_client"] = response.status
        except aiohttp.ClientError:
            out["new_client"] = 0  # the connection was closed before an answer
        for socket in sockets:
            await socket.close()
        await asyncio.gather(*readers)
    return out


async def _sessions_held(server: Server, scale: float) -> dict[str, Any]:
    """Item 6: SESSIONS sessions of many small messages, one after another: how many the proxy holds after,
    and how much its RSS grew."""
    url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
    count = max(2, int(SESSION_MESSAGES * scale))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
        await _post(http, url, _body(conversation(0.1, "warm")), "warm")  # what a first turn loads is loaded
        rss = server.rss_bytes()
        for k in range(SESSIONS):
            messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"s{k} m{i}"} for i in range(count)]
            await _post(http, url, _body(messages), f"held-{k}")
        async with http.get(f"http://127.0.0.1:{server.port}/sessions") as response:
            held = sum(str(row.get("id", "")).startswith("held-") for row in await response.json())
    return {"sent": SESSIONS, "held": held, "rss_growth_mb": (server.rss_bytes() - rss) / 2**20}


async def _read_all(socket: aiohttp.ClientWebSocketResponse) -> None:
    async for _ in socket:
        pass


async def _run_tree(tree: Path, tag: str, scale: float, capsule_mb: float) -> dict[str, Any]:
    upstream = Upstream(int(REFIT_WINDOW * scale))
    upstream_url = await upstream.start()
    body = await asyncio.to_thread(_bodies, tag, scale)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-stall-") as turns_folder:
            config = await asyncio.to_thread(write_config, tree, Path(turns_folder), SERVER, scale, capsule_mb)
            async with serve_config(tree, config, upstream_url) as server:
                result = await _turns(server.port, tag, body)
        with tempfile.TemporaryDirectory(prefix="bench-stall-") as small_folder:
            config = write_config(tree, Path(small_folder), SMALL_SERVER)
            async with serve_config(tree, config, upstream_url) as server:
                result["5"] = await _idle_sockets(server.port, upstream)
                result["6"] = await _sessions_held(server, scale)
        return result
    finally:
        await upstream.runner.cleanup()


async def run_stall_items(ref: str | None = None, scale: float = 1.0, capsule_mb: float = 20) -> dict[str, Any]:
    """The items against the working tree, then against `ref` when given (a `git archive` of it)."""
    result: dict[str, Any] = {"now": await _run_tree(ROOT, f"now-{time.monotonic_ns()}", scale, capsule_mb)}
    if ref:
        with tree_at(ref) as tree:
            result[ref] = await _run_tree(tree, f"ref-{time.monotonic_ns()}", scale, capsule_mb)
    return result


ROWS = (
    ("1", "healthz_worst_s", "a session's 12 MB turn, its small turns meanwhile: longest /healthz wait"),
    ("2", "healthz_worst_s", "a 12 MB turn refused once (refit): longest /healthz wait"),
    ("3", "turn_s", "6 MB body, results in reverse order: its turn"),
    ("3", "victim_s", "  another client's 400 KB turn meanwhile"),
    ("3", "victim_alone_s", "  a like 400 KB turn (other text) alone"),
    ("4", "victim_s", "12 MB of tiny messages: another client's 0.5 MB turn meanwhile"),
    ("4", "victim_alone_s", "  a like 0.5 MB turn (other text) alone"),
    ("13", "warm_turn_s", "a 20 MB capsule: median warm turn (2-4)"),
    ("13", "healthz_worst_s", "  longest /healthz wait over its 4 turns"),
    ("5", "open_after_3s", f"{SLOTS} idle WebSockets at max_connections {SLOTS}: open 3 s on (count)"),
    ("5", "new_client", "  a new client's /healthz (status; 0: connection closed)"),
    ("6", "held", f"{SESSIONS} sessions of {SESSION_MESSAGES:,} messages, memory_mb 8: sessions held (count)"),
    ("6", "rss_growth_mb", "  the proxy's RSS growth (MB)"),
)


def render(result: dict[str, Any]) -> str:
    runs = list(result)
    lines = [f"issue 29's stalls, seconds unless said ({' | '.join(runs)}):"]
    for item, key, label in ROWS:
        figures = " | ".join(f"{result[run][item][key]:8.3f}" for run in runs)
        lines.append(f"  #{item:<3} {label:<70} {figures}")
    return "\n".join(lines)
