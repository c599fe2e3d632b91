"""The packaged agent traces replayed turn by turn through the real proxy, as the agents sent them.

The official SDK streams each request (the whole history each time) through the proxy, with
the real ContextService, to the simulator with a 32k window. The simulator refuses what is
over its window and any request whose tool calls and results do not pair up, so an answer
at all is already proof; the recorded upstream bodies are then checked turn against turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
import orjson
import pytest
import pytest_asyncio

from proxy.config.loader import ConfigHolder, load_settings
from proxy.context.clearing import PLACEHOLDER
from proxy.context.messages import content_text
from proxy.demo.simulator import SIMULATOR, start_simulator
from proxy.demo.traces import Trace, list_traces, load_trace, requests
from proxy.service.engine_service import build_context_service
from proxy.shell.server import start
from tests.context.lossless import missing_lines
from tests.pairing import check_pairing

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "sim-32k"
WINDOW = 32000
RESERVE = 4096

CONFIG = """
[upstream]
base_url = "{url}"

[models."sim-*"]
context_window = 32000
encoding = "o200k_base"
input_per_mtok = 2.50
cached_input_per_mtok = 1.25
output_per_mtok = 10.00

[models."gpt-5*"]
context_window = 400000
encoding = "o200k_base"
input_per_mtok = 1.25
cached_input_per_mtok = 0.125
output_per_mtok = 10.00

[policy]
reserve_output_tokens = 4096
"""

CAPSULES = """
match = ["capsules-*"]

[[capsules]]
id = "tests"
kind = "convention"
tags = ["test"]
text = "Run the repository's tests with `pytest -q` before and after a change."

[[capsules]]
id = "style"
kind = "convention"
text = "Keep changes minimal; do not reformat unrelated code."
"""


@dataclass
class Replay:
    """One trace sent through the proxy: per turn the client's messages, the headers, what went upstream."""

    sent: list[list[dict[str, Any]]] = field(default_factory=list)
    headers: list[Any] = field(default_factory=list)  # httpx.Headers: case-insensitive
    upstream: list[list[dict[str, Any]]] = field(default_factory=list)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def simulator() -> AsyncIterator[tuple[str, Any]]:
    """The module's simulator: its URL and its state (recorded requests)."""
    sim_runner, sim_url = await start_simulator()
    yield sim_url, sim_runner.app[SIMULATOR]
    await sim_runner.cleanup()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def proxy_url(
    tmp_path_factory: pytest.TempPathFactory, simulator: tuple[str, Any]
) -> AsyncIterator[tuple[str, Any]]:
    """One simulator and one proxy for the module: each trace is replayed once, then checked many ways."""
    folder = tmp_path_factory.mktemp("traces")
    sim_url, sim = simulator
    (folder / "sessions").mkdir()
    (folder / "sessions" / "capsules.toml").write_text(CAPSULES)
    (folder / "proxy.toml").write_text(CONFIG.format(url=sim_url))
    holder = ConfigHolder(load_settings(folder / "proxy.toml"))
    runner, port = await start(holder, "127.0.0.1", 0, context=build_context_service(holder))
    yield f"http://127.0.0.1:{port}", sim
    await runner.cleanup()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def replays(proxy_url: tuple[str, Any]) -> dict[str, Replay]:
    root, sim = proxy_url
    return {name: await replay(root, sim, load_trace(name), f"trace-{name}") for name in list_traces()}


async def replay(
    root: str, sim: Any, trace: Trace, session: str, turns: int | None = None, model: str = MODEL
) -> Replay:
    out = Replay()
    extra = {"tools": trace.tools} if trace.tools else {}
    async with openai.AsyncOpenAI(base_url=f"{root}/s/{session}/v1", api_key="sk-trace", max_retries=0) as sdk:
        for k, (messages, _answer) in enumerate(requests(trace)):
            if turns is not None and k == turns:
                break
            raw = await sdk.chat.completions.with_raw_response.create(
                model=model, messages=messages, stream=True, **extra
            )
            assert [chunk async for chunk in raw.parse()], f"turn {k + 1}: empty stream"
            out.sent.append(messages)
            out.headers.append(raw.headers)
            out.upstream.append(sim.requests[-1].body["messages"])
    return out


def encoded(messages: list[dict[str, Any]]) -> list[bytes]:
    return [orjson.dumps(m) for m in messages]


@pytest.mark.parametrize("name", list_traces())
async def test_every_turn_of_every_trace_reaches_a_32k_upstream_inside_the_window_and_valid(
    replays: dict[str, Replay], name: str
) -> None:
    trace, run = load_trace(name), replays[name]

    assert len(run.upstream) == trace.turns  # the simulator answered every turn: in its window, pairs valid
    task = next(m for m in trace.messages if m["role"] == "user")
    for k, (sent, upstream, headers) in enumerate(zip(run.sent, run.upstream, run.headers, strict=True)):
        assert check_pairing(upstream) == [], f"turn {k + 1}"
        assert int(headers["X-Context-Tokens-After"]) <= WINDOW - RESERVE, f"turn {k + 1}"
        assert upstream[-1] == sent[-1], f"turn {k + 1}: the last message was altered"
        assert task in upstream, f"turn {k + 1}: the task was dropped"


@pytest.mark.parametrize("name", list_traces())
async def test_between_epochs_each_upstream_request_extends_the_last_byte_for_byte(
    replays: dict[str, Replay], name: str
) -> None:
    """Byte for byte, but for the last request's newest output, which may come back compacted: every line
    of it still standing in the request (`policy.compact`; that re-bills that one message)."""
    trace, run = load_trace(name), replays[name]

    epochs = [k for k, h in enumerate(run.headers) if h["X-Context-Epoch"] == "1"]
    assert len(epochs) <= max(2, trace.turns // 6), f"epochs at turns {epochs}: not rare batches"
    for k in range(1, len(run.upstream)):
        if k in epochs:
            continue
        before, now = encoded(run.upstream[k - 1]), encoded(run.upstream[k])
        assert now[: len(before) - 1] == before[:-1], f"turn {k + 1} changed the cached prefix without an epoch"
        if now[len(before) - 1] != before[-1]:
            assert missing_lines(run.upstream[k - 1][-1], run.upstream[k]) == [], f"turn {k + 1}: lines lost"


@pytest.mark.parametrize("name", list_traces())
async def test_cleared_outputs_stay_cleared_and_short_errors_are_never_cleared(
    replays: dict[str, Replay], name: str
) -> None:
    run = replays[name]

    cleared_before = 0
    for k, upstream in enumerate(run.upstream):
        cleared = sum(1 for m in upstream if m.get("content") == PLACEHOLDER)
        dropped = "omitted]" in " ".join(content_text(m) or "" for m in upstream if m.get("role") == "system")
        assert cleared >= cleared_before or dropped, f"turn {k + 1}: a cleared output came back"
        cleared_before = cleared
        sent_errors = [
            m for m in run.sent[k] if m.get("role") == "tool" and (content_text(m) or "").startswith("Traceback")
        ]
        for error in sent_errors:
            if len(error["content"]) < 2000:  # well under errors_keep_under (1000 tokens)
                assert error in upstream or dropped, f"turn {k + 1}: a short error output was edited"


async def test_capsules_are_injected_once_and_replayed_in_place(proxy_url: tuple[str, Any]) -> None:
    root, sim = proxy_url
    run = await replay(root, sim, load_trace("sweagent_marshmallow-1867.json"), "capsules-run", turns=8)

    def capsule_positions(upstream: list[dict[str, Any]]) -> list[int]:
        return [i for i, m in enumerate(upstream) if "pytest -q" in (content_text(m) or "")]

    assert run.headers[0]["X-Context-Diff"].startswith("added=2 ")
    first = capsule_positions(run.upstream[0])
    assert len(first) == 1
    for k in range(1, len(run.upstream)):
        assert capsule_positions(run.upstream[k]) == first, f"turn {k + 1}: capsule moved or sent twice"
        assert run.headers[k]["X-Context-Diff"].startswith("added=0 kept=2 "), run.headers[k]["X-Context-Diff"]


async def test_regenerated_history_cuts_the_journal_and_arrives_as_edited(proxy_url: tuple[str, Any]) -> None:
    root, sim = proxy_url
    trace = load_trace("mini_django-11138.tools.json")
    run = await replay(root, sim, trace, "regen", turns=30)

    # The client regenerates an early answer: same history up to it, a different answer, new results.
    history = run.sent[-1]
    k = max(i for i in range(20) if history[i]["role"] == "assistant")
    edited = {**history[k], "content": "THOUGHT: a different plan, regenerated by the client."}
    results = [{"role": "tool", "tool_call_id": c["id"], "content": "regenerated"} for c in edited["tool_calls"]]
    history = [*history[:k], edited, *results]
    async with openai.AsyncOpenAI(base_url=f"{root}/s/regen/v1", api_key="sk-trace", max_retries=0) as sdk:
        await sdk.chat.completions.create(model=MODEL, messages=history, tools=trace.tools)
    upstream = sim.requests[-1].body["messages"]
    assert upstream[-1] == history[-1]
    assert edited in upstream
    assert check_pairing(upstream) == []
    assert encoded(upstream)[:3] == encoded(run.upstream[-1])[:3]  # the journal kept the aligned prefix


async def test_a_warm_turn_parsed_from_the_last_body_sends_upstream_what_a_full_parse_sends(
    proxy_url: tuple[str, Any], simulator: tuple[str, Any], tmp_path: Any
) -> None:
    """The body memos reuse each turn's repeated prefix; a proxy with `body_memo_mb = 0` parses every body whole."""
    root, sim = proxy_url
    trace = load_trace("mini_django-11138.tools.json")
    before = await reused_messages(root)
    remembered = await replay(root, sim, trace, "memo-on", turns=40)
    assert await reused_messages(root) - before > 40 * 20  # most of each turn came from the memo

    (tmp_path / "proxy.toml").write_text(CONFIG.format(url=simulator[0]) + "\n[state]\nbody_memo_mb = 0\n")
    holder = ConfigHolder(load_settings(tmp_path / "proxy.toml"))
    runner, port = await start(holder, "127.0.0.1", 0, context=build_context_service(holder))
    try:
        before = await reused_messages(root)
        full = await replay(f"http://127.0.0.1:{port}", sim, trace, "memo-off", turns=40)
        assert await reused_messages(root) == before  # (one metrics registry per process)
    finally:
        await runner.cleanup()
    for k, (a, b) in enumerate(zip(remembered.upstream, full.upstream, strict=True)):
        assert encoded(a) == encoded(b), f"turn {k + 1}"
    assert [h["X-Context-Epoch"] for h in remembered.headers] == [h["X-Context-Epoch"] for h in full.headers]


async def reused_messages(root: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{root}/metrics") as response:
        text = await response.text()
    lines = text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith("context_proxy_messages_reused_total"))


async def test_with_a_cheap_cache_a_clearing_that_would_not_repay_by_the_next_turn_waits_and_says_so(
    proxy_url: tuple[str, Any],
) -> None:
    """gpt-5 reads its cache at a tenth of the input price. On mini_django's first 60 turns no clearing repays
    its rewrite by the next turn: every request goes up as the client sent it (but for outputs compacted, every line
    of them still in the request, which banks a little), and `/sessions/{id}` shows what a clearing would free,
    per turn and now."""
    root, sim = proxy_url
    run = await replay(root, sim, load_trace("mini_django-11138.tools.json"), "cheap-cache", turns=60, model="gpt-5")
    assert [h["X-Context-Epoch"] for h in run.headers] == ["0"] * 60
    for upstream, sent in zip(run.upstream, run.sent, strict=True):
        assert len(upstream) == len(sent) and all(not missing_lines(m, upstream) for m in sent)
    compacted = sum(upstream != sent for upstream, sent in zip(run.upstream, run.sent, strict=True))
    async with aiohttp.ClientSession() as http, http.get(f"{root}/sessions/cheap-cache") as response:
        session = await response.json()
    assert compacted >= 5 and session["epochs"] == 0 and session["banked"] > 0
    # The upstream caches in steps of 128 tokens: what a compaction re-bills can differ from our count by a step.
    assert session["saved_usd"] >= -0.01 * session["direct_cost_usd"]
    held = [t["held_back"] for t in session["turn_details"]]
    assert held[:3] == [0, 0, 0] and max(held) >= 5_000  # grows as old outputs pile up
    assert session["clearing_held_back_tokens"] == held[-1] > 0
    assert session["idle_s"] > 0  # measured between the last two requests (0 only on a first one)


async def test_recall_misses_and_reruns_of_cleared_calls_show_per_session_and_per_policy(
    replays: dict[str, Replay], proxy_url: tuple[str, Any]
) -> None:
    root, _ = proxy_url
    name = "mini_django-11138.tools.json"
    run = replays[name]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{root}/sessions/trace-{name}") as response:
            session = await response.json()
        async with http.get(f"{root}/metrics") as response:
            metrics = await response.text()

    # The agent re-ran calls whose outputs the proxy had cleared: their arguments were in the upstream request.
    reruns = session["cleared_reruns"]
    assert reruns >= 1 and sum(t["reruns"] for t in session["turn_details"]) <= reruns
    assert session["recall_misses"] >= 1
    assert 0 < session["miss_heat"] <= session["recall_misses"]  # the misses, fading turn by turn
    cleared_turns = [
        k for k, upstream in enumerate(run.upstream) if any(m.get("content") == PLACEHOLDER for m in upstream)
    ]
    assert cleared_turns and session["turn_details"][-1]["turn"] == trace_turns(name)

    def total(metric: str) -> float:
        prefix = f'{metric}{{policy="default"}} '
        return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(prefix))

    assert total("context_proxy_recall_misses_total") >= session["recall_misses"]
    assert total("context_proxy_cleared_reruns_total") >= reruns


def trace_turns(name: str) -> int:
    return load_trace(name).turns
