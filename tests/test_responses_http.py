"""The Responses API (`/v1/responses`) through the real proxy and engine, with the official SDK as the client.

The simulator speaks the Responses API as the real one does (events, usage, refusals), signs the
reasoning items it issues and refuses an unpaired call or an altered reasoning item, so an
answer through the proxy is already proof that nothing it must not touch was touched.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from proxy.context.clearing import PLACEHOLDER
from proxy.context.policy import ModelInfo
from proxy.demo.simulator import SimulatorConfig
from proxy.demo.simulator.items import seal
from proxy.demo.traces import load_trace
from proxy.demo.traces_responses import responses_requests
from proxy.tokens.counter import counter_for
from tests.conftest import MakeRig
from tests.harness import Rig

TOOLS = [
    {"type": "function", "name": "bash", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
]
REASONED = {"store": False, "reasoning": {"effort": "low"}, "include": ["reasoning.encrypted_content"]}


def sdk(rig: Rig, path: str = "/v1", **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=rig.root + path, api_key="sk-responses", max_retries=0, default_headers=headers or None
    )


def upstream_body(rig: Rig) -> dict[str, Any]:
    return orjson.loads(rig.sim.requests[-1].raw)


async def agent_turns(client: openai.AsyncOpenAI, turns: int, output: str = "x" * 400, **extra: Any) -> list[Any]:
    """An agent loop: each turn sends the whole history back with the model's items and a tool output."""
    items: list[Any] = [{"role": "user", "content": "Fix the failing test."}]
    for k in range(turns):
        response = await client.responses.create(model="gpt-4o", input=items, tools=TOOLS, **REASONED, **extra)
        items += [item.model_dump(exclude_none=True) for item in response.output]
        call = response.output[-1]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": f"step {k} {output}"})
    return items


def chat_history(n: int) -> list[dict[str, Any]]:
    """A task, then `n` messages in turn from the assistant and the user (the task alone is never removed)."""
    said = [{"role": ("assistant", "user")[k % 2], "content": f"message {k} " + "z " * 40} for k in range(n)]
    return [{"role": "user", "content": "The task."}, *said]


@pytest.fixture
async def engine_rig(make_rig: MakeRig) -> Rig:
    return await make_rig(engine=True, sim_config=SimulatorConfig(tool_calls=1))


async def test_a_reasoning_agent_loop_goes_through_with_its_reasoning_items_byte_identical(engine_rig: Rig) -> None:
    async with sdk(engine_rig) as client:
        items = await agent_turns(client, 4)
        raw = await client.responses.with_raw_response.create(model="gpt-4o", input=items, tools=TOOLS, **REASONED)
    response = raw.parse()
    assert response.status == "completed" and response.usage.input_tokens > 0
    assert raw.headers["X-Context-Tokens-Before"] and raw.headers["X-Context-Epoch"] in ("0", "1")
    forwarded = upstream_body(engine_rig)["input"]
    assert [i for i in forwarded if i.get("type") == "reasoning"] == [i for i in items if i.get("type") == "reasoning"]


async def test_streamed_events_reach_the_sdk_and_its_stream_helper_in_order(engine_rig: Rig) -> None:
    async with sdk(engine_rig) as client:
        stream = await client.responses.create(model="gpt-4o", input="Say hello.", stream=True)
        kinds = [event.type async for event in stream]
        async with client.responses.stream(model="gpt-4o", input="Say hello.") as helper:
            final = await helper.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    assert final.output_text == SimulatorConfig().answer and final.usage.input_tokens > 0


async def test_usage_from_response_completed_is_learned_per_session(engine_rig: Rig) -> None:
    async with sdk(engine_rig, "/s/usage-run/v1") as client:
        stream = await client.responses.create(model="gpt-4o", input="Say hello.", stream=True)
        completed = [event async for event in stream][-1]
    session = await engine_rig.context.session_json("usage-run")
    assert session["turn_details"][-1]["prompt_tokens"] == completed.response.usage.input_tokens


async def test_old_function_call_outputs_are_cleared_in_their_output_field_and_short_errors_stay(
    make_rig: MakeRig,
) -> None:
    clearing = {"keep_tokens": 2000, "keep_under": 100, "clear_at_least": 1000}
    rig = await make_rig(engine=True, sim_config=SimulatorConfig(tool_calls=1), policy={"clear_tool_outputs": clearing})
    no_cache = ModelInfo(pattern="gpt-4o", input_per_mtok=1.0, cached_input_per_mtok=1.0)  # d = 1: clearing pays now
    rig.holder.settings = replace(rig.holder.settings, models=(no_cache,))
    async with sdk(rig) as client:
        items = await agent_turns(client, 8, output="y " * 1500)
        items[3]["output"] = "Error: no such file"  # the first call's output: a short error
        await client.responses.create(model="gpt-4o", input=items, tools=TOOLS, **REASONED)
    forwarded = upstream_body(rig)["input"]
    outputs = [i for i in forwarded if i.get("type") == "function_call_output"]
    assert any(o["output"] == PLACEHOLDER for o in outputs)
    assert "Error: no such file" in [o["output"] for o in outputs]
    calls = {i["call_id"] for i in forwarded if i.get("type") == "function_call"}
    assert all(o["call_id"] in calls for o in outputs)  # every output still has its call (the simulator agrees)
    assert forwarded[-1] == items[-1]


async def test_a_trace_over_a_small_window_keeps_every_turn_answered_and_reasoning_intact(make_rig: MakeRig) -> None:
    rig = await make_rig(engine=True, sim_config=SimulatorConfig(models={"gpt-4o": 16000}))
    rig.holder.settings = replace(rig.holder.settings, models=(ModelInfo(pattern="gpt-4o", context_window=16000),))
    bodies = list(responses_requests(load_trace("marshmallow"), "gpt-4o"))
    async with sdk(rig, "/s/small-window/v1") as client:
        for body in bodies:
            await client.responses.create(**body, max_output_tokens=1000)
            sent, forwarded = body["input"], upstream_body(rig)["input"]
            assert forwarded[-1] == sent[-1]
            issued = {i["id"]: i for i in sent if i.get("type") == "reasoning"}
            assert all(issued[i["id"]] == i for i in forwarded if i.get("type") == "reasoning")
    assert rig.sim.totals.refused == 0


async def test_a_streamed_refusal_for_length_is_refitted_before_the_client_sees_an_event(make_rig: MakeRig) -> None:
    # The simulator counts 40 hidden tokens per item the proxy cannot see: its estimate fits, the upstream refuses.
    config = SimulatorConfig(models={"gpt-4o": 6000}, hidden_tokens_per_message=40)
    rig = await make_rig(engine=True, sim_config=config)
    rig.holder.settings = replace(rig.holder.settings, models=(ModelInfo(pattern="gpt-4o", context_window=6000),))
    items = chat_history(24)
    async with sdk(rig, "/s/refit/v1") as client:
        stream = await client.responses.create(model="gpt-4o", input=items, stream=True, max_output_tokens=4000)
        kinds = [event.type async for event in stream]
    assert "error" not in kinds and "response.failed" not in kinds and kinds[-1] == "response.completed"
    assert rig.sim.totals.refused == 1 and rig.sim.totals.answered == 1
    assert (await rig.context.session_json("refit"))["turn_details"][-1]["retried"] is True


async def test_a_refusal_for_length_without_a_count_is_refitted_too(make_rig: MakeRig) -> None:
    config = SimulatorConfig(models={"gpt-4o": 6000}, hidden_tokens_per_message=40)
    rig = await make_rig(engine=True, sim_config=config)
    rig.holder.settings = replace(rig.holder.settings, models=(ModelInfo(pattern="gpt-4o", context_window=6000),))
    items = chat_history(24)
    async with sdk(rig) as client:
        response = await client.responses.create(model="gpt-4o", input=items, max_output_tokens=4000)
    assert response.status == "completed" and rig.sim.totals.refused == 1


async def test_the_simulator_refuses_a_streamed_request_over_its_window_with_events(rig: Rig) -> None:
    async with openai.AsyncOpenAI(base_url=rig.sim_url, api_key="sk-x", max_retries=0) as client:
        stream = await client.responses.create(model="sim-32k", input="word " * 40000, stream=True)
        events = [event async for event in stream]
    assert [e.type for e in events] == ["response.created", "response.in_progress", "error", "response.failed"]
    assert events[2].code == "context_length_exceeded"


async def test_the_simulator_refuses_an_output_without_its_call_and_an_altered_reasoning_item(rig: Rig) -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": seal("rs_1", "thinking")}
    call = {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "done"}
    altered = {**reasoning, "encrypted_content": seal("rs_1", "thinking").replace("gAAAAd", "gAAAAe")}
    async with openai.AsyncOpenAI(base_url=rig.sim_url, api_key="sk-x", max_retries=0) as client:
        assert (await client.responses.create(model="gpt-4o", input=[reasoning, call, output])).status == "completed"
        user = {"role": "user", "content": "hi"}
        for bad in ([user, output], [user, altered, call, output], [user, call, user], [user, reasoning, user]):
            with pytest.raises(openai.BadRequestError):
                await client.responses.create(model="gpt-4o", input=bad)


async def test_a_reasoning_item_is_billed_by_the_reasoning_it_seals_and_the_proxy_estimates_it_so(
    engine_rig: Rig,
) -> None:
    """The upstream bills what the model reads (the sealed reasoning), not the base64 blob's characters, which
    tokenize several times longer: the simulator bills so, and the proxy's estimate follows, not the blob."""
    thought = "I should read the failing test before editing anything. " * 10
    reasoning = [
        {"type": "reasoning", "id": f"rs_{k}", "summary": [], "encrypted_content": seal(f"rs_{k}", thought)}
        for k in range(20)
    ]
    steps = [
        [{"type": "function_call", "call_id": f"c{k}", "name": "bash", "arguments": "{}"},
         {"type": "function_call_output", "call_id": f"c{k}", "output": "ok"}]
        for k in range(20)
    ]  # fmt: skip
    user = {"role": "user", "content": "Fix the failing test."}
    bare = [user, *(item for step in steps for item in step)]
    reasoned = [user, *(item for r, step in zip(reasoning, steps, strict=True) for item in (r, *step))]
    counter = counter_for("o200k_base")
    async with openai.AsyncOpenAI(base_url=engine_rig.sim_url, api_key="sk-x", max_retries=0) as direct:
        without = (await direct.responses.create(model="gpt-4o", input=bare)).usage.input_tokens
        with_reasoning = (await direct.responses.create(model="gpt-4o", input=reasoned)).usage.input_tokens
    per_item = (with_reasoning - without) / len(reasoning)
    assert per_item < 1.2 * counter.count_text(thought) + 10
    assert per_item < 0.5 * counter.count_text(reasoning[0]["encrypted_content"])
    async with sdk(engine_rig, "/s/sealed/v1") as client:
        raw = await client.responses.with_raw_response.create(model="gpt-4o", input=reasoned)
    estimate, billed = int(raw.headers["X-Context-Tokens-Before"]), raw.parse().usage.input_tokens
    assert 0.8 * billed <= estimate <= 1.5 * billed  # calibration from usage corrects the rest


async def test_server_side_history_is_forwarded_unedited_and_says_so(engine_rig: Rig) -> None:
    async with sdk(engine_rig, "/s/stored-history/v1") as client:
        first = await client.responses.create(model="gpt-4o", input="Remember 7.")
        raw = await client.responses.with_raw_response.create(
            model="gpt-4o", input="What number?", previous_response_id=first.id
        )
    assert raw.headers["X-Context-Unedited"] == "previous_response_id"
    turns = (await engine_rig.context.session_json("stored-history"))["turn_details"]
    assert [(t["api"], t["unedited"]) for t in turns] == [("responses", None), ("responses", "previous_response_id")]
    assert engine_rig.sim.requests[-1].raw == orjson.dumps(
        {"model": "gpt-4o", "input": "What number?", "previous_response_id": first.id}
    )


async def test_stored_responses_routes_pass_through(engine_rig: Rig) -> None:
    async with sdk(engine_rig) as client:
        created = await client.responses.create(model="gpt-4o", input="Hello.")
        assert (await client.responses.retrieve(created.id)).id == created.id
        items = await client.responses.input_items.list(created.id)
        assert items.data[0].content[0].text == "Hello."
        with pytest.raises(openai.BadRequestError):
            await client.responses.cancel(created.id)


async def test_session_id_comes_from_codex_header_then_prompt_cache_key_then_metadata(engine_rig: Rig) -> None:
    body = {"model": "gpt-4o", "input": "Hi."}
    async with sdk(engine_rig, session_id="codex-conv") as client:
        await client.responses.create(**body, prompt_cache_key="cache-key")
    async with sdk(engine_rig) as client:
        await client.responses.create(**body, prompt_cache_key="cache-key", metadata={"session_id": "meta"})
        await client.responses.create(**body, metadata={"session_id": "meta"})
        assert upstream_body(engine_rig)["prompt_cache_key"] == "meta"  # set to the session id when absent
    ids = {row["id"] for row in await engine_rig.context.sessions_json()}
    assert {"codex-conv", "cache-key", "meta"} <= ids


async def test_codex_websocket_mode_is_relayed_message_by_message(engine_rig: Rig) -> None:
    create = {"type": "response.create", "model": "gpt-4o", "input": [{"role": "user", "content": "Hi."}]}
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(f"{engine_rig.base_url}/responses", headers={"Authorization": "Bearer sk-ws"}) as socket,
    ):
        await socket.send_str(orjson.dumps(create).decode())
        kinds = []
        while not kinds or kinds[-1] != "response.completed":
            kinds.append(orjson.loads((await socket.receive(timeout=10)).data)["type"])
    assert kinds[0] == "response.created" and "response.output_text.delta" in kinds
    handshake = engine_rig.sim.requests[-1]
    assert (handshake.method, handshake.headers["Authorization"]) == ("GET", "Bearer sk-ws")
