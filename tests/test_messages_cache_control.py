"""Anthropic cache breakpoints through the proxy: at most 4 go upstream, the 1-hour TTL's order and its price.

The official `anthropic` SDK is the client, the simulator is Anthropic (it refuses more than 4 breakpoints
and a 1-hour breakpoint after a 5-minute one, in the real API's words, and splits writes by TTL in usage).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import anthropic
import pytest

from bench.anthropic import unmarked  # the breakpoints move every turn; what they mark is cached
from proxy.context.clearing import PLACEHOLDER
from proxy.context.policy import ModelInfo
from proxy.dialects import CHAT, MESSAGES, RESPONSES
from proxy.dialects.base import Conversation
from proxy.service.engine_service import cache_is_cold
from tests.test_messages_http import SYSTEM, Rig, messages_rig

__all__ = ["messages_rig"]  # the fixture this module uses

FIVE_MINUTES = {"type": "ephemeral"}
ONE_HOUR = {"type": "ephemeral", "ttl": "1h"}
# claude-* in the packaged model table, USD per million tokens: input, 5-minute write (1.25x), 1-hour write (2x), read.
INPUT, WRITE_5M, WRITE_1H, READ = 3.00, 3.75, 6.00, 0.30


async def turn_costs(rig: Rig, session: str) -> list[Any]:
    """`cost_usd` of each turn in `GET /sessions/{id}`, once every turn's usage is recorded (it is recorded as the
    answer's last bytes go out, so it may lag the client by a moment)."""
    url = f"http://127.0.0.1:{rig.port}/sessions/{session}"
    costs: list[Any] = [None]
    for _ in range(500):
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            costs = [turn["cost_usd"] for turn in (await response.json())["turn_details"]]
        if None not in costs:
            break
        await asyncio.sleep(0.01)
    return costs


def marked(body: dict[str, Any]) -> dict[str, Any]:
    """Where the body carries `cache_control`, in the order the API reads blocks: tools, system, messages."""
    found = {f"tools.{k}": t["cache_control"] for k, t in enumerate(body.get("tools") or []) if "cache_control" in t}
    system = body.get("system")
    for k, block in enumerate(system if isinstance(system, list) else []):
        if "cache_control" in block:
            found[f"system.{k}"] = block["cache_control"]
    for i, message in enumerate(body["messages"]):
        for k, block in enumerate(message["content"] if isinstance(message["content"], list) else []):
            if "cache_control" in block:
                found[f"messages.{i}.content.{k}"] = block["cache_control"]
    return found


def _tool_loop(turns: int, output: str) -> list[dict[str, Any]]:
    """A task, then `turns` tool calls each answered by `output`."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test in utils.py."}]
    for k in range(turns):
        call = {"type": "tool_use", "id": f"toolu_{k:03d}", "name": "bash", "input": {"command": f"cat f{k}.py"}}
        messages.append({"role": "assistant", "content": [call]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{k:03d}", "content": f"{k}: {output}"}
        messages.append({"role": "user", "content": [result]})
    return messages


def _six_breakpoints() -> dict[str, Any]:
    tool = {"name": "bash", "description": "Run a command.", "input_schema": {"type": "object"}}
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "tools": [{**tool, "cache_control": FIVE_MINUTES}],
        "system": [
            {"type": "text", "text": "You are a coding agent.", "cache_control": FIVE_MINUTES},
            {"type": "text", "text": SYSTEM, "cache_control": FIVE_MINUTES},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Fix it.", "cache_control": FIVE_MINUTES}]},
            {"role": "assistant", "content": "On it."},
            {"role": "user", "content": [
                {"type": "text", "text": "The test is test_utils.py.", "cache_control": FIVE_MINUTES},
                {"type": "text", "text": "Go on.", "cache_control": FIVE_MINUTES},
            ]},
        ],
    }  # fmt: skip


@pytest.mark.parametrize("place_breakpoints", [True, False], ids=["placing", "not-placing"])
async def test_more_than_four_client_breakpoints_go_upstream_as_the_last_four(
    messages_rig: Any, place_breakpoints: bool
) -> None:
    rig = await messages_rig(place_breakpoints=place_breakpoints)
    body = _six_breakpoints()
    with pytest.raises(anthropic.BadRequestError) as refused:  # what the client would meet without the proxy
        await rig.client("direct", direct=True).messages.create(**body)
    assert "A maximum of 4 blocks with cache_control" in refused.value.body["error"]["message"]
    reply = await rig.client("six").messages.create(**body)
    assert reply.stop_reason == "end_turn"
    sent = rig.sim.requests[-1].body
    assert list(marked(sent)) == ["system.1", "messages.0.content.0", "messages.2.content.0", "messages.2.content.1"]
    assert sent["tools"][0] == {k: v for k, v in body["tools"][0].items() if k != "cache_control"}
    assert sent["system"][0] == {"type": "text", "text": "You are a coding agent."}
    assert sent["messages"] == body["messages"]  # the kept marks as the client sent them


async def test_the_proxys_mark_before_a_client_one_hour_mark_asks_for_one_hour(messages_rig: Any) -> None:
    """The API refuses a 1-hour breakpoint after a 5-minute one: the frontier the proxy adds must not be 5 minutes."""
    rig = await messages_rig()
    messages = _tool_loop(6, "x = 1\n" * 100)
    messages[-1]["content"][-1]["cache_control"] = ONE_HOUR
    system = [{"type": "text", "text": SYSTEM, "cache_control": ONE_HOUR}]
    reply = await rig.client("hour").messages.create(
        model="claude-sonnet-4-5", max_tokens=64, system=system, messages=messages
    )
    assert reply.stop_reason == "end_turn"
    sent = marked(rig.sim.requests[-1].body)
    assert sent == {
        "system.0": ONE_HOUR,
        "messages.1.content.0": ONE_HOUR,  # the frontier
        "messages.11.content.0": ONE_HOUR,  # the stand-in point, before the last message
        "messages.12.content.0": ONE_HOUR,
    }


async def test_the_proxys_mark_after_the_last_one_hour_mark_stays_five_minutes(messages_rig: Any) -> None:
    """A system prompt kept for an hour and a conversation for 5 minutes: the frontier is written at 5 minutes."""
    rig = await messages_rig()
    messages = _tool_loop(6, "x = 1\n" * 100)
    messages[-1]["content"][-1]["cache_control"] = FIVE_MINUTES
    system = [{"type": "text", "text": SYSTEM, "cache_control": ONE_HOUR}]
    client = rig.client("hybrid")
    await client.messages.create(model="claude-sonnet-4-5", max_tokens=64, system=system, messages=messages)
    sent = marked(rig.sim.requests[-1].body)
    assert sent == {
        "system.0": ONE_HOUR,
        "messages.1.content.0": FIVE_MINUTES,
        "messages.11.content.0": FIVE_MINUTES,
        "messages.12.content.0": FIVE_MINUTES,
    }


async def test_a_client_one_hour_mark_before_the_proxys_marks_leaves_them_five_minutes(messages_rig: Any) -> None:
    """Only a client's 1-hour mark after the proxy's makes the proxy's 1 hour: one on the task, before it, does not."""
    rig = await messages_rig()
    messages = _tool_loop(6, "x = 1\n" * 100)
    messages[0] = {
        "role": "user",
        "content": [{"type": "text", "text": messages[0]["content"], "cache_control": ONE_HOUR}],
    }
    messages[-1]["content"][-1]["cache_control"] = FIVE_MINUTES
    await rig.client("task-hour").messages.create(
        model="claude-sonnet-4-5", max_tokens=64, system=SYSTEM, messages=messages
    )
    assert marked(rig.sim.requests[-1].body) == {
        "messages.0.content.0": ONE_HOUR,
        "messages.1.content.0": FIVE_MINUTES,  # the frontier
        "messages.11.content.0": FIVE_MINUTES,  # the stand-in point
        "messages.12.content.0": FIVE_MINUTES,
    }


def _expected_cost(usage: Any) -> float:
    hour = usage.cache_creation.ephemeral_1h_input_tokens
    five = usage.cache_creation.ephemeral_5m_input_tokens
    assert hour + five == usage.cache_creation_input_tokens
    paid = usage.input_tokens * INPUT + five * WRITE_5M + hour * WRITE_1H + usage.cache_read_input_tokens * READ
    return paid / 1e6


async def test_one_hour_cache_writes_are_billed_at_twice_the_input_price(messages_rig: Any) -> None:
    rig = await messages_rig()
    client = rig.client("billed")
    system = [{"type": "text", "text": SYSTEM, "cache_control": ONE_HOUR}]
    question = "Summarise the repository layout. " * 60  # past the hour's mark: written for 5 minutes
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": question, "cache_control": FIVE_MINUTES}]}
    ]
    first = await client.messages.create(model="claude-sonnet-4-5", max_tokens=64, system=system, messages=messages)
    assert first.usage.cache_creation.ephemeral_1h_input_tokens > 1024
    assert first.usage.cache_creation.ephemeral_5m_input_tokens > 0
    messages += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "And tests?"}]
    async with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=64, system=system, messages=messages
    ) as stream:  # the split comes in message_start; message_delta repeats only the totals
        second = await stream.get_final_message()
    assert second.usage.cache_read_input_tokens > 0

    costs = await turn_costs(rig, "billed")
    assert costs == [pytest.approx(_expected_cost(first.usage)), pytest.approx(_expected_cost(second.usage))]


async def test_a_one_hour_last_breakpoint_makes_clearing_wait_for_a_bigger_saving(messages_rig: Any) -> None:
    """An epoch re-writes the tail after its first edit: at the 1-hour price (2x input) the same clearing that pays
    at the 5-minute price (1.25x) does not pay yet. (Either is a bet on the session going on: the session's first
    edit may make it only with `first_edit_risk_turns`.)"""
    rig = await messages_rig(first_edit_risk_turns=1.0)
    cleared = {}
    for name, control in (("five", FIVE_MINUTES), ("hour", ONE_HOUR)):
        messages = _tool_loop(14, "x = 1\n" * 200)
        messages[-1]["content"][-1]["cache_control"] = control
        raw = await rig.client(name).messages.with_raw_response.create(
            model="claude-sonnet-4-5", max_tokens=64, messages=messages
        )
        sent = rig.sim.requests[-1].body["messages"]
        results = [b for m in sent[2::2] for b in m["content"] if b["type"] == "tool_result"]
        cleared[name] = (raw.headers["X-Context-Epoch"], sum(b["content"] == PLACEHOLDER for b in results))
    assert cleared["five"][0] == "1" and cleared["five"][1] > 0
    assert cleared["hour"] == ("0", 0)


async def test_a_session_idle_past_the_cache_ttl_clears_at_once_and_then_replays_it(messages_rig: Any) -> None:
    """Anthropic drops a prefix 5 minutes after its last read: the next request is written in full whatever it
    holds, so the clearing that did not pay while the cache was warm is made then, and replayed after."""
    rig = await messages_rig()
    now = [1_000_000.0]
    rig.context.store.clock = lambda: now[0]
    sent: dict[str, list[list[dict[str, Any]]]] = {}
    epochs: dict[str, list[str]] = {}
    for name, pause in (("warm", 10.0), ("cold", 400.0)):
        client = rig.client(name)
        for loops, wait in ((6, 0.0), (7, pause), (8, 1.0)):
            now[0] += wait
            messages = _tool_loop(loops, "x = 1\n" * 200)
            messages[-1]["content"][-1]["cache_control"] = FIVE_MINUTES
            raw = await client.messages.with_raw_response.create(
                model="claude-sonnet-4-5", max_tokens=64, messages=messages
            )
            sent.setdefault(name, []).append(rig.sim.requests[-1].body["messages"])
            epochs.setdefault(name, []).append(raw.headers["X-Context-Epoch"])
    assert epochs["warm"] == ["0", "0", "0"], "a warm cache: clearing these outputs does not pay yet"
    assert epochs["cold"] == ["0", "1", "0"]

    def cleared(messages: list[dict[str, Any]]) -> int:
        blocks = [b for m in messages if isinstance(m["content"], list) for b in m["content"]]
        return sum(b.get("content") == PLACEHOLDER for b in blocks)

    assert cleared(sent["cold"][1]) > 0 and cleared(sent["warm"][2]) == 0
    last, before = unmarked(sent["cold"][2]), unmarked(sent["cold"][1])
    assert last[: len(before) - 1] == before[:-1], "the turn after replays the clearing byte for byte"
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{rig.port}/sessions/cold") as response:
        details = (await response.json())["turn_details"]
    assert details[1]["reasons"] == ["clearing", "cache_cold"]


async def test_the_simulators_cache_drops_a_prefix_unused_past_its_ttl(messages_rig: Any) -> None:
    """As Anthropic's: a read keeps the prefix another TTL; past it, the same request writes it anew."""
    rig = await messages_rig()
    now = [0.0]
    rig.sim.config.cache_ttl_s, rig.sim.clock = 300.0, lambda: now[0]
    client = rig.client(direct=True)
    system = [{"type": "text", "text": SYSTEM, "cache_control": FIVE_MINUTES}]
    usage = []
    for wait in (0.0, 200.0, 200.0, 301.0):  # the second read comes 400 s after the write, 200 s after a read
        now[0] += wait
        reply = await client.messages.create(
            model="claude-sonnet-4-5", max_tokens=64, system=system, messages=[{"role": "user", "content": "hi"}]
        )
        usage.append((reply.usage.cache_read_input_tokens > 0, reply.usage.cache_creation_input_tokens > 0))
    assert usage == [(False, True), (True, False), (True, False), (False, True)]


def test_a_cache_is_taken_for_cold_only_past_its_ttl_and_a_margin() -> None:
    claude, openai, unknown = ModelInfo(cache_ttl_s=300), ModelInfo(cache_ttl_s=3600), ModelInfo()
    plain, hour = Conversation([], []), Conversation([], [], cache_ttl_s=3600)
    day = Conversation([], [], cache_ttl_s=86400)
    assert not cache_is_cold(claude, plain, 0.0)  # a session's first request
    assert not cache_is_cold(claude, plain, 320.0) and cache_is_cold(claude, plain, 340.0)
    assert not cache_is_cold(claude, hour, 3000.0) and cache_is_cold(claude, hour, 3700.0)
    assert not cache_is_cold(openai, plain, 3600.0) and cache_is_cold(openai, plain, 3700.0)
    assert not cache_is_cold(openai, day, 80000.0) and cache_is_cold(openai, day, 90000.0)
    assert not cache_is_cold(unknown, plain, 86400.0 * 7)  # no TTL known: never assumed cold


def test_the_ttl_a_client_asks_for_reaches_the_engine() -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert CHAT.conversation({"messages": messages, "prompt_cache_retention": "24h"}).cache_ttl_s == 86400
    assert CHAT.conversation({"messages": messages, "prompt_cache_retention": "in_memory"}).cache_ttl_s is None
    assert RESPONSES.conversation({"input": "hi", "prompt_cache_retention": "24h"}).cache_ttl_s == 86400
    hour = {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": ONE_HOUR}]}
    assert MESSAGES.conversation({"messages": [hour]}).cache_ttl_s == 3600
    assert MESSAGES.conversation({"messages": messages}).cache_ttl_s is None


def _billed(usage: Any) -> float:
    """Anthropic's input bill in full-price tokens: input + 1.25 x written + 0.1 x read."""
    return usage.input_tokens + 1.25 * usage.cache_creation_input_tokens + 0.1 * usage.cache_read_input_tokens


async def test_a_compacted_last_output_rebills_only_itself_under_claude_codes_breakpoints(messages_rig: Any) -> None:
    """Claude Code marks the system prompt and the last message. A tool output that repeats an earlier one goes as
    sent while it is the last message and compacted from the next turn on; Anthropic keeps a prefix only where a
    request marked one, so unless the proxy marked the message before it, the next turn re-wrote everything after
    the previous turn's last mark: here a long assistant reply, at 1.25x instead of 0.1x, and the run cost more
    than direct."""
    rig = await messages_rig()
    output = "".join(f"line {n}: value_{n * 7919 % 10007} = compute({n})\n" for n in range(120))
    reply = "Reading the module again, line by line. " * 700  # ~7k tokens the turn after re-reads from the cache

    def use(k: int) -> dict[str, Any]:
        return {"type": "tool_use", "id": f"toolu_{k}", "name": "bash", "input": {"command": "cat utils.py"}}

    def result(k: int) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": output}]}

    turns: list[list[dict[str, Any]]] = [[{"role": "user", "content": "Fix the failing test in utils.py."}]]
    turns.append([*turns[-1], {"role": "assistant", "content": [use(0)]}, result(0)])
    turns.append([*turns[-1], {"role": "assistant", "content": [{"type": "text", "text": reply}, use(1)]}, result(1)])
    for note in ("Which test fails?", "Go on."):
        turns.append([*turns[-1], {"role": "assistant", "content": "Looking."}, {"role": "user", "content": note}])
    system = [{"type": "text", "text": SYSTEM, "cache_control": FIVE_MINUTES}]
    billed: dict[str, float] = {}
    for name, direct in (("direct", True), ("proxied", False)):
        client = rig.client(f"cc-{name}", direct=direct, api_key=f"sk-ant-{name}")  # a cache of its own
        billed[name] = 0.0
        for messages in turns:
            messages = unmarked(messages)
            last = messages[-1]
            content = (
                last["content"] if isinstance(last["content"], list) else [{"type": "text", "text": last["content"]}]
            )
            messages[-1] = {**last, "content": [*content[:-1], {**content[-1], "cache_control": FIVE_MINUTES}]}
            answer = await client.messages.create(
                model="claude-sonnet-4-5", max_tokens=64, system=system, messages=messages
            )
            billed[name] += _billed(answer.usage)
    compacted = rig.sim.requests[-1].body["messages"][4]["content"][0]["content"]
    assert compacted != output, "the repeated output went compacted (what this test is about)"
    assert billed["proxied"] <= billed["direct"], billed
