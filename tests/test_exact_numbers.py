"""Fields the proxy does not edit keep their exact bytes when it re-serialises a body: integers past 64 bits too.

orjson reads 2**64 as a float, so every body the proxy rewrites (usage asked for on a streamed chat, a
`prompt_cache_key` set on Responses, cache breakpoints placed on Messages) sent `1.8446744073709552e+19`.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.dialects.body_checks import may_hold_wide_integer
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


@pytest.mark.parametrize(
    "text",
    [
        b"18446744073709551616",  # the whole body a number
        b'{"n":18446744073709551616}',
        b'{"n": -9223372036854775809}',
        b'{"n" :\n\t 18446744073709551616.5}',
        b"[1,18446744073709551616]",
        b"[\n  18446744073709551616\n]",
        b'{"a": "id 12", "n": [0, 0,\r\n-18446744073709551616]}',
    ],
)
def test_every_integer_token_of_19_digits_is_caught_however_the_json_is_spaced(text: bytes) -> None:
    assert may_hold_wide_integer(text)


@pytest.mark.parametrize(
    "text",
    [
        b'{"sig": "Fs.61604023379287819240792c0"}',  # a run inside a string, after a dot
        b'{"log": "took 18446744073709551616ns"}',
        b'{"hash": "sha:x18446744073709551616"}',
        b'{"n": 1.5e18446744073709551616}',  # an exponent: no integer
        b'{"n": 123456789012345678}',  # 18 digits: within 64 bits
    ],
)
def test_a_run_of_digits_no_number_token_starts_with_is_not_a_wide_integer(text: bytes) -> None:
    assert not may_hold_wide_integer(text)


async def test_a_pretty_printed_body_keeps_its_wide_integers_too(rig: Rig) -> None:
    """A client that indents its JSON puts spaces and line breaks before a number: still read exactly."""
    body = {
        **_responses(),
        "metadata": {"n": "BIG"},
        "input": [{"role": "user", "content": "Count 12345678901234567890x."}],
    }
    raw = json.dumps(body, indent=2).replace('"BIG"', str(BIG)).replace('"NEGATIVE"', str(NEGATIVE)).encode()
    async with aiohttp.ClientSession() as http, http.post(rig.root + "/v1/responses", data=raw) as response:
        await response.read()
        assert response.status == 200
    sent = rig.sim.requests[-1].raw
    assert b"%d" % BIG in sent and b"%d" % NEGATIVE in sent and b"e+19" not in sent
