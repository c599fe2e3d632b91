"""Fields the proxy does not edit keep their exact bytes when it re-serialises a body: integers past 64 bits too.

orjson reads 2**64 as a float, so every body the proxy rewrites (usage asked for on a streamed chat, a
`prompt_cache_key` set on Responses, cache breakpoints placed on Messages) sent `1.8446744073709552e+19`.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from tests.harness import Rig, start_rig

BIG = 18446744073709551616  # 2**64: one past what an unsigned 64-bit integer holds
NEGATIVE = -9223372036854775809  # one below a signed 64-bit integer
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": "NEGATIVE", "maximum": "BIG"}}}


def _chat() -> dict[str, Any]:
    tool = {"type": "function", "function": {"name": "count", "parameters": SCHEMA}}
    return {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "Count."}], "tools": [tool]}


def _responses() -> dict[str, Any]:
    tool = {"type": "function", "name": "count", "parameters": SCHEMA}
    return {"model": "gpt-4o", "input": "Count.", "tools": [tool]}


def _messages() -> dict[str, Any]:
    tool = {"name": "count", "description": "Counts.", "input_schema": SCHEMA}
    system = "You are a careful agent. " * 300  # long enough for the proxy to place a breakpoint after it
    return {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": system, "tools": [tool],
            "messages": [{"role": "user", "content": "Count."}]}  # fmt: skip


@pytest.fixture(params=[True, False], ids=["engine", "passthrough"])
async def rig(request: pytest.FixtureRequest) -> Any:
    rig = await start_rig(engine=request.param)
    yield rig
    await rig.close()


@pytest.mark.parametrize(
    ("path", "body", "rewritten"),
    [
        ("/v1/chat/completions", _chat, b'"stream_options"'),
        ("/v1/responses", _responses, b'"prompt_cache_key"'),
        ("/v1/messages", _messages, b'"cache_control"'),
    ],
    ids=["streamed-chat", "responses", "messages-breakpoints"],
)
async def test_integers_past_64_bits_keep_their_digits_in_a_rewritten_body(
    rig: Rig, path: str, body: Any, rewritten: bytes
) -> None:
    raw = orjson.dumps(body()).replace(b'"BIG"', b"%d" % BIG).replace(b'"NEGATIVE"', b"%d" % NEGATIVE)
    assert b"%d" % BIG in raw and b"%d" % NEGATIVE in raw
    headers = {"Content-Type": "application/json", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as http, http.post(rig.root + path, data=raw, headers=headers) as response:
        await response.read()
        assert response.status == 200
    sent = rig.sim.requests[-1].raw
    if rig.context is not None:  # the engine rewrites the body (the pass-through sends the client's bytes)
        assert rewritten in sent and rewritten not in raw
    assert b'"maximum":%d' % BIG in sent and b'"minimum":%d' % NEGATIVE in sent
    assert b"e+19" not in sent and b"e19" not in sent


async def test_a_warm_turn_parsed_from_its_sessions_last_body_keeps_them_too(rig: Rig) -> None:
    """A warm chat turn parses only what follows the remembered messages (service/body_memos.py): same rule."""
    first = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "Count. " * 400}]}
    second = {**first, "messages": [*first["messages"], {"role": "assistant", "content": "1"},
                                    {"role": "user", "content": "Again.", "x_trace_id": "BIG"}]}  # fmt: skip
    async with aiohttp.ClientSession() as http:
        for body in (first, second):
            raw = orjson.dumps(body).replace(b'"BIG"', b"%d" % BIG)
            async with http.post(rig.root + "/s/warm/v1/chat/completions", data=raw) as response:
                await response.read()
                assert response.status == 200
    assert b'"x_trace_id":%d' % BIG in rig.sim.requests[-1].raw
