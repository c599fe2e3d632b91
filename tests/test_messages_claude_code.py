"""What Claude Code sends, through the proxy: the official `anthropic` SDK as the client, the simulator as Anthropic.

System messages mid-conversation, bodies of shapes the proxy does not model, the 1M-context beta,
the proxy's own refusals in Anthropic's words, retried requests, and several conversations (main
thread, subagent, title request) under one Claude Code session id. tests/agents/ drives the real CLI.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from tests.test_messages_http import SYSTEM
from tests.test_messages_http import messages_rig as _messages_rig  # noqa: F401  (the fixture, by its name)

SESSION = {"X-Claude-Code-Session-Id": "cc-run"}
REMINDER = "# Environment\nPrimary working directory: /work\nAvailable agent types: general-purpose, explore."
EPHEMERAL = {"type": "ephemeral"}


def _claude_code_messages(turns: int, output: str, task: str = "Fix the failing test.") -> list[dict[str, Any]]:
    """As Claude Code lays out a conversation: the task, a system message, then `turns` Bash calls and results."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": task}]},
        {"role": "system", "content": [{"type": "text", "text": REMINDER, "cache_control": EPHEMERAL}]},
    ]
    for k in range(turns):
        call = {"type": "tool_use", "id": f"toolu_{k:03d}", "name": "Bash", "input": {"command": f"run {k}"}}
        messages.append({"role": "assistant", "content": [call]})
        text = f"step {k}: " + output.replace("\n", f" (run {k})\n")  # no line repeats another run's
        result = {"type": "tool_result", "tool_use_id": f"toolu_{k:03d}", "content": text}
        messages.append({"role": "user", "content": [result]})
        if k % 7 == 3:
            note = "The task tools haven't been used recently."
            messages.append({"role": "system", "content": [{"type": "text", "text": note}]})
    return messages


def _marked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with Claude Code's breakpoint on the last block of the last one."""
    last = dict(messages[-1])
    last["content"] = [*last["content"][:-1], {**last["content"][-1], "cache_control": EPHEMERAL}]
    return [*messages[:-1], last]


def _unmarked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages without breakpoints (which move every turn)."""
    strip = [[{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]] for m in messages]
    return [{**m, "content": blocks} for m, blocks in zip(messages, strip, strict=True)]


async def _session(rig: Any, session_id: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{rig.port}/sessions/{session_id}") as r:
        assert r.status == 200
        return await r.json()


async def test_system_messages_mid_conversation_are_forwarded_counted_and_never_cleared(messages_rig: Any) -> None:
    rig = await messages_rig()
    client = rig.client(default_headers=SESSION)
    messages = _claude_code_messages(60, "line of build output\n" * 120)  # ~40k tokens: over a 32k window
    reply = await client.messages.create(model="claude-sim-32k", max_tokens=1024, system=SYSTEM, messages=messages)
    assert reply.stop_reason == "end_turn"
    sent = rig.sim.requests[-1].body["messages"]
    assert _unmarked(sent) != _unmarked(messages)  # edited to fit (cleared, compacted or cut) ...
    systems = [m for m in messages if m["role"] == "system"]
    assert [m for m in sent if m["role"] == "system"] == systems  # ... and every system message as it came


async def test_a_body_the_proxy_does_not_model_goes_as_sent_and_the_upstream_judges(messages_rig: Any) -> None:
    rig = await messages_rig()
    raw = orjson.dumps({
        "model": "claude-sonnet-4-5", "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": 7}],
    })  # fmt: skip
    headers = {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    url = f"http://127.0.0.1:{rig.port}/v1/messages"
    async with aiohttp.ClientSession() as http, http.post(url, data=raw, headers=headers) as response:
        status, body = response.status, await response.json()
    assert rig.sim.requests[-1].raw == raw  # the client's bytes
    assert (
        status == 400 and body["error"]["message"] == "messages.1.role: Input should be 'user', 'assistant' or 'system'"
    )


def _distinct(lines: int) -> str:
    """Tool output whose lines all differ (nothing in it repeats for an edit to fold)."""
    return "".join(f"{i:05d} checked {i * 7919 % 10007} of {i * 104729 % 65521}\n" for i in range(lines))


def _long(turns: int) -> list[dict[str, Any]]:
    return _marked(_claude_code_messages(turns, _distinct(110)))


async def test_the_1m_context_beta_and_a_1m_model_id_get_a_1m_window(messages_rig: Any) -> None:
    rig = await messages_rig()
    messages = _long(105)  # ~250k tokens: over 200k, well within 1M
    beta = {**SESSION, "anthropic-beta": "claude-code-20250219,context-1m-2025-08-07"}
    for model, headers in (("claude-sonnet-4-5", beta), ("claude-sonnet-4-5[1m]", SESSION)):
        client = rig.client(default_headers=headers)
        raw = await client.messages.with_raw_response.create(model=model, max_tokens=1024, messages=messages)
        assert raw.headers["X-Context-Window"] == "1000000"
        assert raw.headers["X-Context-Tokens-After"] == raw.headers["X-Context-Tokens-Before"]  # 250k of 1M: kept
    plain = rig.client(default_headers={"X-Claude-Code-Session-Id": "cc-200k"})
    raw = await plain.messages.with_raw_response.create(model="claude-sonnet-4-5", max_tokens=1024, messages=messages)
    assert raw.headers["X-Context-Window"] == "200000" and int(raw.headers["X-Context-Tokens-After"]) < 200_000


async def test_the_proxys_own_refusals_read_as_anthropics(messages_rig: Any) -> None:
    rig = await messages_rig()
    client = rig.client(default_headers=SESSION)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.BadRequestError) as with_output:  # fits, but not with max_tokens on top
        await client.messages.create(
            model="claude-sim-32k", max_tokens=31_000, system=SYSTEM, messages=messages, timeout=60
        )
    error = with_output.value.body
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    words = error["error"]["message"]
    assert words.startswith("input length and `max_tokens` exceed context limit: ") and "+ 31000 > 32000," in words
    with pytest.raises(anthropic.BadRequestError) as too_long:  # a system prompt alone past the window
        await client.messages.create(model="claude-sim-32k", max_tokens=1024, system=SYSTEM * 30, messages=messages)
    words = too_long.value.body["error"]["message"]
    assert words.startswith("prompt is too long: ") and words.endswith(" tokens > 32000 maximum")
    assert rig.sim.totals.requests == 0


async def test_a_session_the_proxy_never_edited_saves_exactly_zero(messages_rig: Any) -> None:
    rig = await messages_rig()
    client = rig.client(default_headers=SESSION)
    system = [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}]
    for turns in (1, 2, 3, 4):
        messages = _marked(_claude_code_messages(turns, _distinct(300)))
        await client.messages.create(model="claude-sonnet-4-5", max_tokens=1024, system=system, messages=messages)
    session = await _session(rig, "cc-run")
    assert session["cost_usd"] > 0 and rig.sim.totals.written_tokens > 0
    assert session["saved_usd"] == 0 and session["direct_cost_usd"] == session["cost_usd"]


async def test_a_request_retried_after_an_upstream_error_is_one_turn(messages_rig: Any) -> None:
    rig = await messages_rig()
    messages = _marked(_claude_code_messages(2, "ok\n" * 50))
    failing = rig.client(default_headers={**SESSION, "X-Sim-Fault": "status-503"})
    with pytest.raises(anthropic.InternalServerError):
        await failing.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=messages)
    client = rig.client(default_headers=SESSION)
    await client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=messages)
    session = await _session(rig, "cc-run")
    assert session["turns"] == 1 and [t["prompt_tokens"] is not None for t in session["turn_details"]] == [True]


async def test_conversations_under_one_session_id_keep_their_own_journals(messages_rig: Any) -> None:
    """Claude Code's main thread, a subagent and a title request share one session id: the main thread sends
    exactly what it sends alone, its edits replayed turn after turn."""
    rig = await messages_rig()
    alone, shared = (
        rig.client(default_headers={"X-Claude-Code-Session-Id": "cc-alone"}),
        rig.client(default_headers=SESSION),
    )
    system = [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}]
    output = _distinct(40)
    sent: dict[str, list[Any]] = {"alone": [], "shared": []}
    asked = []
    for turns in range(70, 82):
        main = _marked(_claude_code_messages(turns, output))
        asked.append(_unmarked(main))
        for name, client in (("alone", alone), ("shared", shared)):
            await client.messages.create(model="claude-sim-32k", max_tokens=1024, system=system, messages=main)
            sent[name].append(_unmarked(rig.sim.requests[-1].body["messages"]))
        side = _marked(_claude_code_messages(turns - 69, output, task="Explore the tests folder."))
        await shared.messages.create(model="claude-sim-32k-sub", max_tokens=1024, system="Subagent.", messages=side)
        title = [{"role": "user", "content": "Write a 5-word title for: Fix the failing test."}]
        await shared.messages.create(model="claude-sim-32k-sub", max_tokens=64, system="Titles.", messages=title)
    assert any(body != client for body, client in zip(sent["alone"][:-2], asked, strict=False))  # edited early on
    assert sent["shared"] == sent["alone"]
    session = await _session(rig, "cc-run")
    assert len(session["conversations"]) == 3 and session["turns"] == 36
    assert sorted(c["turns"] for c in session["conversations"]) == [12, 12, 12]
    assert session["saved_usd"] >= 0
