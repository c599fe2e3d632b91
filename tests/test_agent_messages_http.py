"""In an epoch, the agent's older messages that the epoch re-bills anyway keep the head and tail of their text
(`policy.agent_message_tokens`); its tool calls, its last `agent_messages_kept` messages and everything before the
epoch's first change go as the client wrote them, and the cut goes up byte for byte on every later turn.

An agent that writes its reasoning out, driven through the real proxy by the official SDK, behind a 128k window with
no cache discount: every clearing pays long before the window is near, and each one re-bills what follows the first
output it clears.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
import pytest_asyncio

from proxy.config.loader import ConfigHolder, load_settings
from proxy.context.clearing import PLACEHOLDER
from proxy.context.fitting import CUT_MARKER
from proxy.demo.simulator import SIMULATOR, start_simulator
from proxy.demo.simulator.blocks import sign
from proxy.service.engine_service import build_context_service
from proxy.shell.server import start
from proxy.tokens.counter import counter_for
from tests.harness import scripted_agent
from tests.pairing import check_pairing

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONFIG = """
[upstream]
base_url = "{url}"

[anthropic]
base_url = "{anthropic}"

[models."claude-sim-d1"]
context_window = 128000
encoding = "o200k_base"
input_per_mtok = 1.0
cached_input_per_mtok = 1.0
cache_write_per_mtok = 1.0

[models."gpt-4o"]
context_window = 128000
encoding = "o200k_base"
input_per_mtok = 1.0
cached_input_per_mtok = 1.0

[models."sim-16k"]
context_window = 16000
encoding = "o200k_base"
input_per_mtok = 1.0
cached_input_per_mtok = 1.0

[policy]
reserve_output_tokens = 4096
"""
OFF = 'match = ["off-*"]\n\n[policy]\nagent_message_tokens = 0\n'
LOSSLESS = 'match = ["lossless-*"]\n\n[policy]\nmode = "lossless"\n'
TEXT_MODE = "match = [\"text-*\"]\n\n[policy.clear_tool_outputs]\nobservation_patterns = ['\\Arun \\d+ ']\n"
COUNTER = counter_for("o200k_base")
STEPS = 24


def thought(k: int) -> str:
    """The agent's reasoning at step `k`: a first line, a long middle, a conclusion naming the script it runs."""
    middle = "\n".join(f"Hypothesis {k}.{j}: the parser at offset {k * 100 + j} drops the header." for j in range(36))
    return f"THOUGHT {k}: checking the header parser again.\n{middle}\nSo I run check_{k}.py next."


def arguments(k: int) -> str:
    return f'{{"command": "python check_{k}.py --verbose"}}'


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def proxy(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[str, Any]]:
    sim_runner, sim_url = await start_simulator()
    folder = tmp_path_factory.mktemp("agent-messages")
    (folder / "proxy.toml").write_text(CONFIG.format(url=sim_url, anthropic=sim_url.removesuffix("/v1")))
    (folder / "sessions").mkdir()
    (folder / "sessions" / "off.toml").write_text(OFF)
    (folder / "sessions" / "lossless.toml").write_text(LOSSLESS)
    (folder / "sessions" / "text.toml").write_text(TEXT_MODE)
    holder = ConfigHolder(load_settings(folder / "proxy.toml"))
    runner, port = await start(holder, "127.0.0.1", 0, context=build_context_service(holder))
    yield f"http://127.0.0.1:{port}", sim_runner.app[SIMULATOR]
    await runner.cleanup()
    await sim_runner.cleanup()


async def agent(
    root: str, sim: Any, session: str, model: str = "gpt-4o"
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """The agent's run through the proxy: its own messages, and what went upstream each turn."""
    return await scripted_agent(
        f"{root}/s/{session}/v1", sim, STEPS, lambda k: (thought(k), arguments(k), f"run {k} " + "x " * 150), model
    )


async def epochs(root: str, session: str) -> list[int]:
    async with aiohttp.ClientSession() as http, http.get(f"{root}/sessions/{session}") as response:
        details = (await response.json())["turn_details"]
    return [t["turn"] for t in details if t["epoch"]]


def agent_turns(request: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in request if m.get("role") == "assistant"]


async def test_an_epoch_cuts_the_agents_older_messages_it_rebills_and_keeps_its_calls(proxy: tuple[str, Any]) -> None:
    root, sim = proxy
    messages, upstream = await agent(root, sim, "cuts")
    sent_by_client = agent_turns(messages)

    # an epoch once the agent has written more than the six messages kept whole (1-based turns, as /sessions counts)
    turn = next(t for t in await epochs(root, "cuts") if len(agent_turns(upstream[t - 1])) > 7)
    request, previous = upstream[turn - 1], upstream[turn - 2]
    changed = next(i for i, (m, p) in enumerate(zip(request, previous, strict=False)) if m != p)
    assert request[changed]["content"] == PLACEHOLDER  # the epoch's first change: an output it cleared
    sent = agent_turns(request)
    cut = [k for k, m in enumerate(sent) if m["content"] != sent_by_client[k]["content"]]
    assert cut
    for k in cut:
        m = sent[k]
        assert request.index(m) > changed  # only what the epoch re-bills anyway
        assert m["tool_calls"] == sent_by_client[k]["tool_calls"]  # the call goes whole
        head, tail = m["content"].split("\n", 1)[0], m["content"].rsplit("\n", 1)[-1]
        assert head == f"THOUGHT {k}: checking the header parser again." and tail == f"So I run check_{k}.py next."
        assert CUT_MARKER.split("{", 1)[0] in m["content"]
        assert COUNTER.count_text(m["content"]) <= 500 < COUNTER.count_text(sent_by_client[k]["content"])
    assert sent[-6:] == sent_by_client[len(sent) - 6 : len(sent)]  # the agent's last six go whole
    for later in upstream[turn:]:  # made once, then sent byte for byte
        assert agent_turns(later)[: len(sent) - 6] == sent[: len(sent) - 6]
        assert check_pairing(later) == []


@pytest.mark.parametrize(("session", "model"), [("off-1", "gpt-4o"), ("lossless-1", "sim-16k")])
async def test_no_agent_message_is_cut_when_turned_off_or_lossless(
    proxy: tuple[str, Any], session: str, model: str
) -> None:
    root, sim = proxy
    messages, upstream = await agent(root, sim, session, model)

    assert await epochs(root, session)  # epochs were made (the 16k window forces them in lossless mode)
    for request in upstream:
        sent = agent_turns(request)
        assert all(m in agent_turns(messages) for m in sent)  # each as the client wrote it (or dropped whole)


async def test_where_the_window_truncates_the_last_six_the_agent_sees_go_whole(proxy: tuple[str, Any]) -> None:
    root, sim = proxy
    messages, upstream = await agent(root, sim, "cuts-16k", "sim-16k")

    written = {m["content"] for m in agent_turns(messages)}
    assert await epochs(root, "cuts-16k")  # the window forced them
    assert any(m["content"] not in written for m in agent_turns(upstream[-1]))  # and older messages were cut
    for request in upstream:
        assert all(m["content"] in written for m in agent_turns(request)[-6:])


async def claude(root: str, sim: Any, session: str, thinking: bool) -> tuple[list[Any], list[list[dict[str, Any]]]]:
    """The same agent through Anthropic's Messages API (text and `tool_use` blocks; a signed thinking block first
    when `thinking`): its assistant messages' blocks, and what went upstream each turn."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the header parsing bug."}]
    upstream = []
    client = anthropic.AsyncAnthropic(base_url=f"{root}/s/{session}", api_key="sk-ant-test", max_retries=0)
    async with client:
        for k in range(STEPS):
            blocks: list[dict[str, Any]] = [{"type": "text", "text": thought(k)}]
            if thinking:
                blocks.insert(0, {"type": "thinking", "thinking": f"step {k}", "signature": sign(f"step {k}")})
            blocks.append({"type": "tool_use", "id": f"toolu_{k:03d}", "name": "bash", "input": {"command": f"k{k}"}})
            messages.append({"role": "assistant", "content": blocks})
            result = {"type": "tool_result", "tool_use_id": f"toolu_{k:03d}", "content": f"run {k} " + "x " * 150}
            messages.append({"role": "user", "content": [result]})
            await client.messages.create(model="claude-sim-d1", max_tokens=256, messages=messages)  # type: ignore[arg-type]
            upstream.append(sim.requests[-1].body["messages"])
    return [m["content"] for m in messages if m["role"] == "assistant"], upstream


def bare(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks without the cache marks the proxy places (`[anthropic] place_breakpoints`)."""
    return [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks]


@pytest.mark.parametrize("thinking", [False, True])
async def test_messages_cuts_text_blocks_and_never_a_message_with_thinking(
    proxy: tuple[str, Any], thinking: bool
) -> None:
    root, sim = proxy
    written, upstream = await claude(root, sim, f"claude-{thinking}", thinking)

    assert await epochs(root, f"claude-{thinking}")
    last = [bare(m["content"]) for m in upstream[-1] if m["role"] == "assistant"]
    changed = [k for k, blocks in enumerate(last) if blocks != written[k]]
    if thinking:
        assert changed == []  # thinking makes the message opaque: it goes as written, signature and all
        return
    assert changed and changed[-1] < len(last) - 6
    for k in changed:
        text = next(b["text"] for b in last[k] if b["type"] == "text")
        assert text.startswith(f"THOUGHT {k}:") and text.endswith(f"check_{k}.py next.") and "tokens cut" in text
        assert [b for b in last[k] if b["type"] == "tool_use"] == [b for b in written[k] if b["type"] == "tool_use"]


async def test_responses_cuts_a_text_agents_message_items(proxy: tuple[str, Any]) -> None:
    """The same agent through the Responses API as a text-mode agent: its reasoning and command in `message` items,
    each observation a user message (`observation_patterns`). An assistant item followed by function calls is one
    group with them, never edited (`dialects/responses_groups.py`): only items that stand alone are cut."""
    root, sim = proxy
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Fix the header parsing bug."}]
    upstream = []
    async with openai.AsyncOpenAI(base_url=f"{root}/s/text-responses/v1", api_key="sk-test", max_retries=0) as sdk:
        for k in range(STEPS):
            text = {"type": "output_text", "text": thought(k), "annotations": []}
            items.append({"type": "message", "role": "assistant", "id": f"msg_{k}", "content": [text]})
            observation = f"run {k} " + "x " * 150
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": observation}]})
            await sdk.responses.create(model="gpt-4o", input=items)  # type: ignore[arg-type]
            upstream.append(sim.requests[-1].body["input"])

    assert await epochs(root, "text-responses")
    sent = [i for i in upstream[-1] if i.get("type") == "message" and i.get("role") == "assistant"]
    cut = [i for i in sent if i["content"][0]["text"] != thought(int(i["id"].split("_")[1]))]
    assert cut and all(i["id"] not in {m["id"] for m in sent[-6:]} for i in cut)
    for item in cut:
        k = int(item["id"].split("_")[1])
        assert set(item) == {"type", "role", "id", "content"} and item["content"][0]["type"] == "output_text"
        text = item["content"][0]["text"]
        assert text.startswith(f"THOUGHT {k}:") and text.endswith(f"check_{k}.py next.") and "tokens cut" in text
