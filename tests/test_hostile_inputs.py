"""Hostile request bodies against a real proxy: a 4xx in OpenAI's shape or a forwarded request, never a 5xx or a hang.

Hypothesis generates the bodies; a blocking client with a timeout runs in a thread while the
proxy and the simulator serve on this test's event loop.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness import ENGINES, Rig, chat_body, is_openai_error, start_rig

CLIENT_TIMEOUT_S = 30
MAX_BODY_MB = 4
# Generated bodies per engine; HOSTILE_EXAMPLES=3000 for a longer hunt outside CI.
EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "150"))


@pytest.fixture(params=ENGINES)
async def rig(request):
    rig = await start_rig(engine=request.param, server={"max_body_mb": MAX_BODY_MB})
    yield rig
    await rig.close()


def post(port: int, raw: bytes, path: str = "/v1/chat/completions") -> tuple[int, bytes]:
    """POST with a blocking client and a timeout: a hang fails the test instead of stalling it."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    try:
        conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def healthz(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    finally:
        conn.close()


def dumps(value: object) -> bytes:
    """JSON as a client library would write it (big integers included, which orjson refuses)."""
    return json.dumps(value, ensure_ascii=False).encode()


def assert_acceptable(status: int, data: bytes, what: object) -> None:
    """A forwarded answer (2xx) or a 4xx in OpenAI's error shape; never a 5xx."""
    assert status < 500, f"{status} {data[:300]!r} for {str(what)[:300]}"
    if status >= 400:
        assert is_openai_error(json.loads(data)), data[:300]


# ---- generated bodies ---------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "root", "", "USER"])
parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "x"]) | json_values},
    optional={
        "text": st.text(max_size=40) | json_values,
        "image_url": json_values,
    },
)
tool_calls = st.fixed_dictionaries(
    {"id": st.sampled_from(["call_1", "call_2"]) | json_values},
    optional={
        "type": st.just("function") | json_values,
        "function": st.fixed_dictionaries({"name": st.text(max_size=10), "arguments": st.text(max_size=30)})
        | json_values,
    },
)
messages = st.fixed_dictionaries(
    {"role": roles | json_values},
    optional={
        "content": st.none() | st.text(max_size=200) | st.lists(parts | json_values, max_size=3) | json_values,
        "tool_calls": st.lists(tool_calls, max_size=3) | json_values,
        "tool_call_id": st.sampled_from(["call_1", "call_2", "nope"]) | json_values,
        "name": json_values,
    },
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["gpt-4o", "sim-32k", "gpt-5"]) | json_values,
        "messages": st.lists(messages, max_size=6) | json_values,
        "stream": st.booleans() | json_values,
        "max_tokens": st.integers(-5, 200_000) | json_values,
        "max_completion_tokens": json_values,
        "stream_options": json_values,
        "tools": json_values,
        "metadata": json_values,
    },
)


@st.composite
def broken_bytes(draw) -> bytes:
    """A valid body cut short, or with invalid UTF-8 or a stray byte spliced in."""
    raw = dumps(draw(bodies))
    at = draw(st.integers(0, len(raw)))
    splice = draw(st.sampled_from([b"", b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\x00", b"}", b'"']))
    return raw[:at] + splice + (raw[at:] if draw(st.booleans()) else b"")


raw_bodies = st.one_of(
    bodies.map(dumps),
    json_values.map(dumps),
    broken_bytes(),
    st.binary(max_size=64),
)


async def test_generated_bodies_get_a_4xx_or_are_forwarded(rig: Rig) -> None:
    @settings(
        max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "150")),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(raw=raw_bodies)
    def check(raw: bytes) -> None:
        status, data = post(rig.port, raw)
        assert_acceptable(status, data, raw)

    await asyncio.to_thread(check)
    assert await asyncio.to_thread(healthz, rig.port) == 200


# ---- the named hostile cases --------------------------------------------------------------------


def _with_messages(messages: list) -> bytes:
    return orjson.dumps({"model": "gpt-4o", "messages": messages})


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


CALL = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
HOSTILE = {
    "invalid_json": b'{"model": "gpt-4o", "messages": [',
    "not_an_object": b"[1, 2, 3]",
    "empty_body": b"",
    "invalid_utf8": b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
    "lone_surrogate_escape": b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\\ud800"}]}',
    "nesting_5000_deep": _deep(5000),
    "nesting_5000_deep_in_content": b'{"model":"gpt-4o","messages":[{"role":"user","content":' + _deep(5000) + b"}]}",
    "nesting_300_deep_in_metadata": b'{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"metadata":'
    + _deep(300)
    + b"}",
    "nesting_300_deep_in_a_content_part": b'{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text",'
    b'"text":"hi","x":' + _deep(300) + b"}]}]}",
    "integer_5000_digits": b'{"model":"gpt-4o","max_tokens":' + b"9" * 5000 + b',"messages":[{"role":"user",'
    b'"content":"hi"}]}',
    "float_5000_digits": b'{"model":"gpt-4o","temperature":0.' + b"1" * 5000 + b',"messages":[{"role":"user",'
    b'"content":"hi"}]}',
    "messages_not_a_list": orjson.dumps({"model": "gpt-4o", "messages": {"role": "user"}}),
    "missing_messages": orjson.dumps({"model": "gpt-4o"}),
    "missing_model": orjson.dumps({"messages": [{"role": "user", "content": "hi"}]}),
    "unknown_role": _with_messages([{"role": "wizard", "content": "hi"}]),
    "role_not_a_string": _with_messages([{"role": ["user"], "content": "hi"}]),
    "content_a_number": _with_messages([{"role": "user", "content": 7}]),
    "tool_calls_an_object": _with_messages([{"role": "assistant", "tool_calls": {"id": 1}}]),
    "tool_result_without_call": _with_messages(
        [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_9", "content": "out"}]
    ),
    "call_without_result": _with_messages(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    ),
    "call_with_garbage_inside": _with_messages(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [1, None, "x", {"function": 3}]}]
    ),
    "ten_thousand_messages": _with_messages(
        [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(10_000)]
    ),
    "enormous_single_string": _with_messages([{"role": "user", "content": "a" * (3 * 1024 * 1024)}]),
    "enormous_tool_output_mid_history": _with_messages(
        [
            {"role": "user", "content": "read it"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "line\n" * 600_000},
            {"role": "user", "content": "and now?"},
        ]
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_hostile_body_gets_a_4xx_or_is_forwarded(rig: Rig, name: str) -> None:
    status, data = await asyncio.to_thread(post, rig.port, HOSTILE[name])
    assert_acceptable(status, data, name)
    assert await asyncio.to_thread(healthz, rig.port) == 200


async def test_a_normal_request_still_goes_through_with_the_sdk(rig: Rig) -> None:
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(base_url=rig.base_url, api_key="sk-test", max_retries=0, timeout=10)
    async with client:
        answer = await client.chat.completions.create(**chat_body())
    assert answer.choices[0].message.content


# ---- body size limit ----------------------------------------------------------------------------


async def _read_status(reader: asyncio.StreamReader) -> int:
    line = await asyncio.wait_for(reader.readline(), 5)
    return int(line.split()[1])


async def test_declared_oversized_body_is_refused_before_it_is_read(rig: Rig) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {10 * 1024**3}\r\n\r\n"
    )
    writer.write(head.encode() + b'{"model": "gpt-4o", "messages": [')
    await writer.drain()
    try:
        assert await _read_status(reader) == 413
    finally:
        writer.close()
    assert not rig.sim.requests


async def test_chunked_body_that_keeps_going_is_refused_at_the_limit(rig: Rig) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (64 * 1024, b"a" * 64 * 1024)
    sent, cap = 0, 256 * 1024 * 1024

    async def keep_sending() -> None:
        nonlocal sent
        while sent < cap:
            writer.write(chunk)
            await writer.drain()
            sent += 64 * 1024

    sender = asyncio.create_task(keep_sending())
    try:
        status = await asyncio.wait_for(reader.readline(), 10)
        assert int(status.split()[1]) == 413
        assert sent < cap, "the proxy read the whole endless body"
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        writer.close()
    assert not rig.sim.requests
    assert await asyncio.to_thread(healthz, rig.port) == 200


async def test_oversized_passthrough_body_is_refused(rig: Rig) -> None:
    raw = b"x" * (MAX_BODY_MB * 1024 * 1024 + 1)
    status, data = await asyncio.to_thread(post, rig.port, raw, "/v1/embeddings")
    assert status == 413
    assert is_openai_error(json.loads(data))
