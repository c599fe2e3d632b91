"""Every failure the shell handles: its own errors in OpenAI's shape, the upstream's passed through."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from proxy.demo.simulator import STATUS_FAULTS
from tests.harness import closed_port, settle

MODEL = "gpt-4o-mini"
MESSAGES = [{"role": "user", "content": "Say hello."}]


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="sk-client", max_retries=0, timeout=10)


async def post_raw(url: str, data, headers: dict | None = None) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http, http.post(url, data=data, headers=headers) as response:
        return response.status, await response.json(content_type=None)


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (b'{"model": "echo", "messages": [', None, "could not parse the JSON"),
        (b"[1, 2]", None, "must be a JSON object"),
        (b'{"model": "echo"}', "messages", "Missing required parameter"),
        (b'{"model": "echo", "messages": {"role": "user"}}', "messages", "expected an array"),
        (b'{"model": "echo", "messages": [{"role": "user", "content": "a"}, "hi"]}', "messages[1]", "an object"),
        (b'{"model": "echo", "messages": [{"content": "a"}]}', "messages[0].role", "Missing required"),
        (b'{"model": "echo", "messages": [{"role": "wizard", "content": "a"}]}', "messages[0].role", "'wizard'"),
        (b'{"model": "echo", "messages": [{"role": "user", "content": 5}]}', "messages[0].content", "a number"),
        (b'{"model": "echo", "messages": [{"role": "user", "content": ["x"]}]}', "messages[0].content[0]", "object"),
        (
            b'{"model": "echo", "messages": [{"role": "assistant", "content": null, "tool_calls": {}}]}',
            "messages[0].tool_calls",
            "expected an array",
        ),
    ],
)
async def test_malformed_chat_bodies_get_a_400_naming_the_problem(rig, body, param, fragment):
    status, payload = await post_raw(f"{rig.base_url}/chat/completions", body, {"Content-Type": "application/json"})
    assert status == 400
    assert payload["error"]["type"] == "invalid_request_error"
    assert payload["error"]["param"] == param
    assert fragment in payload["error"]["message"]
    assert list(rig.sim.requests) == []


async def test_the_sdk_raises_bad_request_for_a_malformed_message(rig):
    with pytest.raises(openai.BadRequestError) as caught:
        await client(rig.base_url).chat.completions.create(model=MODEL, messages=[{"role": "nobody", "content": "x"}])
    assert caught.value.param == "messages[0].role"


async def test_a_body_over_the_limit_is_refused_with_413(make_rig):
    rig = await make_rig(server={"max_body_mb": 0.01})  # ~10 KB
    big = [{"role": "user", "content": "x" * 20_000}]
    with pytest.raises(openai.APIStatusError) as caught:
        await client(rig.base_url).chat.completions.create(model=MODEL, messages=big)
    assert caught.value.status_code == 413

    async def chunked():  # no Content-Length: counted while read
        for _ in range(40):
            yield b"x" * 1024

    for path in ("chat/completions", "embeddings"):
        status, payload = await post_raw(f"{rig.base_url}/{path}", chunked())
        assert status == 413 and payload["error"]["code"] == "request_too_large"
    assert all(len(seen.raw) < 20_000 for seen in rig.sim.requests)


async def test_an_unreachable_upstream_is_a_502(make_rig):
    rig = await make_rig(upstream_url=f"http://127.0.0.1:{closed_port()}/v1")
    with pytest.raises(openai.APIStatusError) as caught:
        await client(rig.base_url).chat.completions.create(model=MODEL, messages=MESSAGES)
    assert caught.value.status_code == 502 and caught.value.code == "upstream_unreachable"
    with pytest.raises(openai.APIStatusError) as caught:
        await client(rig.base_url).models.list()
    assert caught.value.status_code == 502


async def test_a_silent_upstream_is_a_504_and_its_request_is_dropped(make_rig):
    rig = await make_rig(upstream={"read_timeout_s": 0.3})
    with pytest.raises(openai.APIStatusError) as caught:
        await client(rig.base_url).chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_headers={"X-Sim-Fault": "silence"}
        )
    assert caught.value.status_code == 504 and caught.value.code == "upstream_timeout"
    assert await settle(lambda: rig.sim.totals.disconnects == 1, timeout=5)


@pytest.mark.parametrize(("status", "error"), [(401, openai.AuthenticationError), (429, openai.RateLimitError)])
async def test_upstream_errors_pass_through_with_status_headers_and_body(rig, status, error):
    with pytest.raises(error) as caught:
        await client(rig.base_url).chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_headers={"X-Sim-Fault": f"status-{status}"}
        )
    _, message, _, code, headers = STATUS_FAULTS[f"status-{status}"]
    assert caught.value.body["message"] == message
    assert caught.value.code == code
    if status == 429:
        assert caught.value.response.headers["retry-after"] == headers["retry-after"] == "1"
        assert caught.value.response.headers["x-ratelimit-remaining-requests"] == "0"


async def test_upstream_5xx_passes_through(rig):
    with pytest.raises(openai.InternalServerError) as caught:
        await client(rig.base_url).chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_headers={"X-Sim-Fault": "status-503"}
        )
    assert caught.value.status_code == 503


async def test_an_upstream_dying_mid_stream_ends_the_stream_with_an_error_event(rig):
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    dying = {"X-Sim-Fault": "reset-mid-stream"}  # after fault_after_chunks = 2 events
    received = b""
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{rig.base_url}/chat/completions", json=body, headers=dying) as response,
    ):
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for chunk in response.content.iter_any():
                received += chunk
    assert received.count(b'data: {"id"') == 2
    assert received.endswith(b"\n\n") and received.rsplit(b"\n\n", 2)[1].startswith(b'data: {"error":')
    assert b"[DONE]" not in received

    with pytest.raises(openai.APIError, match="cut short"):
        stream = await client(rig.base_url).chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True, extra_headers=dying
        )
        async for _ in stream:
            pass
    answer = await client(rig.base_url).chat.completions.create(model=MODEL, messages=MESSAGES)
    assert answer.choices[0].message.content  # the proxy keeps serving


async def test_a_client_that_disconnects_cancels_the_upstream_request(rig):
    stream = await client(rig.base_url).chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, extra_headers={"X-Sim-Fault": "silence-mid-stream"}
    )
    first = await stream.__anext__()
    assert first.choices[0].delta.role == "assistant"
    await stream.close()
    assert await settle(lambda: rig.sim.totals.disconnects == 1, timeout=5)
    assert rig.sim.active_streams == 0


async def test_unknown_non_api_routes_are_404_in_openai_shape(rig):
    async with aiohttp.ClientSession() as http, http.get(f"{rig.root}/nope") as response:
        assert response.status == 404
        assert (await response.json())["error"]["type"] == "not_found_error"
