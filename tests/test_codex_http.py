"""What Codex CLI does on the wire, met by the real proxy over real sockets (issue 26, the Codex half).

A scripted upstream on 127.0.0.1 plays the Responses API the way the real one behaves where
it matters here: it holds the connection a moment after `response.completed` (Codex hangs up
at that event), refuses the WebSocket upgrade with 426, and states the real prompt size when
it refuses one for length. The real Codex binary is driven in tests/agents/.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.context.policy import ModelInfo
from tests.conftest import MakeRig
from tests.harness import Rig, settle

USAGE = {"input_tokens": 1234, "input_tokens_details": {"cached_tokens": 1000}, "output_tokens": 5}


def event(kind: str, **data: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


class Scripted:
    """A Responses upstream: every POST answered with a streamed message, then held open `linger_s`."""

    def __init__(self, linger_s: float = 0.0) -> None:
        self.linger_s = linger_s
        self.stall_s = 0.0  # before the answer's headers
        self.bodies: list[dict[str, Any]] = []
        self.upgrades = 0
        self.url = ""  # its base URL, ending in /v1
        self.refusals: list[str] = []  # the next requests are refused for length (400) with these messages

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            self.upgrades += 1
            return web.Response(status=426, text="Upgrade Required: this server speaks HTTP only.")
        raw = await request.read()
        await asyncio.sleep(self.stall_s)
        self.bodies.append(orjson.loads(raw))
        if self.refusals:
            error = {"message": self.refusals.pop(0), "type": "invalid_request_error", "param": "input"}
            return web.json_response({"error": {**error, "code": "context_length_exceeded"}}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
        item["content"] = [{"type": "output_text", "text": "Done.", "annotations": []}]
        created = {"id": f"resp_{len(self.bodies)}", "object": "response", "status": "in_progress", "output": []}
        await response.write(event("response.created", response=created))
        await response.write(event("response.output_item.done", output_index=0, item=item))
        done = {**created, "status": "completed", "output": [item], "usage": USAGE}
        await response.write(event("response.completed", response=done))
        await asyncio.sleep(self.linger_s)  # the connection stays open a moment after the last event
        await response.write_eof()
        return response


@pytest.fixture
async def upstream() -> AsyncIterator[Scripted]:
    scripted = Scripted()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", scripted.handle)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    scripted.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    yield scripted
    await runner.cleanup()


def codex_body(task: str = "Fix the test.", **extra: Any) -> dict[str, Any]:
    env = "<environment_context>\n  <cwd>/work</cwd>\n</environment_context>"
    return {
        "model": "gpt-4o",
        "stream": True,
        "store": False,
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": env}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]},
        ],
        **extra,
    }


async def hang_up_after(url: str, body: dict[str, Any], marker: bytes, **headers: str) -> bytes:
    """POST `body` and close the connection as soon as `marker` arrived, as Codex does at `response.completed`."""
    received = b""
    headers = {"Authorization": "Bearer sk-codex", **headers}
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as response:
        assert response.status == 200
        async for chunk in response.content.iter_any():
            received += chunk
            if marker in received:
                break
        response.close()  # the connection goes down with the upstream still open
    return received


async def turns_of(rig: Rig, session: str) -> list[dict[str, Any]]:
    found = await rig.context.session_json(session)
    return found["turn_details"] if found else []


async def billed_turns(rig: Rig, session: str, count: int, timeout: float = 2.0) -> list[dict[str, Any]]:
    """The session's turns once `count` of them have their usage (the last may still be recording it)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        turns = await turns_of(rig, session)
        if (len(turns) == count and turns[-1]["prompt_tokens"] is not None) or loop.time() > end:
            return turns
        await asyncio.sleep(0.01)


def requests_counted(rig: Rig, status: str) -> float:
    from proxy.metrics import METRICS

    found = re.search(rf'context_proxy_requests_total\{{route="responses",status="{status}"\}} (\S+)', METRICS.render())
    return float(found[1]) if found else 0.0


async def test_a_turn_whose_client_hangs_up_at_response_completed_keeps_its_usage_and_is_logged(
    upstream: Scripted, make_rig: MakeRig, caplog: pytest.LogCaptureFixture
) -> None:
    upstream.linger_s = 1.0
    caplog.set_level(logging.INFO, logger="proxy.access")
    rig = await make_rig(upstream_url=upstream.url, engine=True)
    hung_up_before = requests_counted(rig, "499")
    for _ in range(3):
        url = rig.base_url + "/responses"
        received = await hang_up_after(url, codex_body(), b"response.completed", **{"session-id": "c1"})
        assert b"response.completed" in received
    turns = await billed_turns(rig, "c1", 3)
    assert [t["prompt_tokens"] for t in turns] == [1234] * 3
    assert [t["cached_tokens"] for t in turns] == [1000] * 3
    assert requests_counted(rig, "499") == hung_up_before  # each was answered whole: a 200, not a 499
    assert await settle(lambda: len([r for r in caplog.records if "POST /v1/responses 200" in r.getMessage()]) == 3)


async def test_a_client_gone_before_its_answer_began_is_counted_and_logged_as_499(
    upstream: Scripted, make_rig: MakeRig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="proxy.access")
    rig = await make_rig(upstream_url=upstream.url, engine=True)
    before = requests_counted(rig, "499")
    upstream.stall_s = 5.0
    async with aiohttp.ClientSession() as http:
        with pytest.raises(asyncio.TimeoutError):
            await http.post(rig.base_url + "/responses", json=codex_body(), timeout=aiohttp.ClientTimeout(total=0.3))
    assert await settle(lambda: requests_counted(rig, "499") == before + 1)
    assert await settle(lambda: any("POST /v1/responses 499" in r.getMessage() for r in caplog.records))


async def test_an_upstream_that_refuses_the_websocket_upgrade_is_answered_with_its_own_status(
    upstream: Scripted, make_rig: MakeRig
) -> None:
    rig = await make_rig(upstream_url=upstream.url, engine=True)
    headers = {"Authorization": "Bearer sk-ws", "session-id": "c-ws", "openai-beta": "responses_websockets=2026-02-06"}
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(rig.base_url + "/responses", headers=headers)
    assert refused.value.status == 426  # Codex falls back to HTTP at once on it; a 502 it retries for seconds
    assert upstream.upgrades == 1


async def test_codex_session_id_header_names_the_session(upstream: Scripted, make_rig: MakeRig) -> None:
    rig = await make_rig(upstream_url=upstream.url, engine=True)
    async with aiohttp.ClientSession() as http:
        for task in ("One task.", "Another task."):  # two conversations, one Codex session
            headers = {"Authorization": "Bearer sk-codex", "session-id": "019a-codex"}
            async with http.post(rig.base_url + "/responses", json=codex_body(task), headers=headers) as response:
                await response.read()
    assert [row["id"] for row in await rig.context.sessions_json()] == ["019a-codex"]


async def test_a_refusal_that_states_the_real_prompt_size_is_refitted_with_it(
    upstream: Scripted, make_rig: MakeRig
) -> None:
    rig = await make_rig(upstream_url=upstream.url, engine=True)
    rig.holder.settings = replace(rig.holder.settings, models=(ModelInfo(pattern="gpt-4o", context_window=8000),))
    # The upstream counts twice what the proxy estimates (a foreign tokenizer), and says so; it names its limit first.
    upstream.refusals = [
        "This model's maximum context length is 1000 tokens. However, your messages resulted in 9000 tokens. "
        "Please reduce the length of the messages."
    ]
    body = codex_body(max_output_tokens=2000)
    for k in range(20):
        call = {"type": "function_call", "call_id": f"call_{k}", "name": "exec_command", "arguments": "{}"}
        output = {"type": "function_call_output", "call_id": f"call_{k}", "output": f"{k} " + "y " * 150}
        body["input"] += [call, output]
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": "Bearer sk-codex", "session-id": "refit"}
        async with http.post(rig.base_url + "/responses", json=body, headers=headers) as response:
            assert response.status == 200, await response.text()
            assert b"response.completed" in await response.read()
    sent, refitted = upstream.bodies
    assert len(refitted["input"]) < len(sent["input"]) == len(body["input"])
    assert (await turns_of(rig, "refit"))[-1]["retried"] is True


async def test_a_previous_response_id_chain_stays_one_session_with_every_turn_billed(
    upstream: Scripted, make_rig: MakeRig
) -> None:
    rig = await make_rig(upstream_url=upstream.url, engine=True)
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": "Bearer sk-chain"}
        body: dict[str, Any] = codex_body()
        for _ in range(3):  # the first sends the whole input; each next link only its new input
            async with http.post(rig.base_url + "/responses", json=body, headers=headers) as response:
                answer = await response.read()
            last = orjson.loads([line for line in answer.split(b"\n") if b"response.completed" in line][-1][6:])
            previous = last["response"]["id"]
            body = {"model": "gpt-4o", "stream": True, "previous_response_id": previous, "input": "Go on."}
    rows = await rig.context.sessions_json()
    assert len(rows) == 1 and rows[0]["turns"] == 3
    turns = await billed_turns(rig, rows[0]["id"], 3)
    assert [t["unedited"] for t in turns] == [None, "previous_response_id", "previous_response_id"]
    assert [t["prompt_tokens"] for t in turns] == [1234] * 3
