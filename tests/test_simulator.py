"""The simulated upstream: OpenAI's wire format, its billing model, its refusals and its faults."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path

import aiohttp
import openai
import pytest
from multidict import CIMultiDict

from proxy.context.pipeline import tools_tokens
from proxy.context.tokens import REPLY_PRIMING
from proxy.demo.simulator import SIMULATOR, SimulatorConfig, pairing_error, start_simulator
from proxy.demo.traces import list_traces, load_trace, requests
from proxy.tokens.counter import counter_for

SSE_DIR = Path(__file__).parent / "data" / "sse"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
async def sim():
    runner, url = await start_simulator(SimulatorConfig(chunks=8, slow_headers_s=0.3))
    yield runner.app[SIMULATOR], url
    await runner.cleanup()


def client(url: str, **kw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0, **kw)


def long_message(role: str, n: int, tag: str = "") -> dict:
    """A message of roughly 6·n tokens, unique per tag."""
    return {"role": role, "content": f"{tag} " + " ".join(f"line {i}: the quick brown fox" for i in range(n))}


def chat_body(**extra) -> dict:
    return {"model": "sim-32k", "messages": HELLO, **extra}


async def post(url: str, body: dict, headers: dict | None = None, **kw) -> tuple[int, CIMultiDict, bytes]:
    async with (
        aiohttp.ClientSession(**kw) as http,
        http.post(f"{url}/chat/completions", json=body, headers=headers) as resp,
    ):
        return resp.status, resp.headers.copy(), await resp.read()


# --- wire format -------------------------------------------------------------------------------


async def test_stream_is_parsed_by_the_sync_sdk(sim):
    state, url = sim

    def run() -> tuple[list, object]:
        sync = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0)
        chunks = list(
            sync.chat.completions.create(
                model="sim-32k", messages=HELLO, stream=True, stream_options={"include_usage": True}
            )
        )
        return chunks, sync.chat.completions.create(model="sim-32k", messages=HELLO)

    chunks, whole = await asyncio.to_thread(run)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == state.config.answer == whole.choices[0].message.content
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 8
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    assert whole.usage.prompt_tokens == chunks[-1].usage.prompt_tokens


async def test_stream_is_paced_by_the_delay_header_for_the_async_sdk(sim):
    _, url = sim
    stream = await client(url).chat.completions.create(
        model="sim-32k", messages=HELLO, stream=True, extra_headers={"X-Sim-Delay-Ms": "40", "X-Sim-Chunks": "4"}
    )
    arrivals = []
    async for chunk in stream:
        arrivals.append(time.monotonic())
        assert chunk.usage is None  # not asked for
    assert len(arrivals) == 6  # role, 4 content, finish
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert min(gaps) > 0.025, gaps


async def test_raw_stream_matches_the_recorded_openai_format(sim):
    _, url = sim
    status, headers, raw = await post(url, chat_body(stream=True, stream_options={"include_usage": True}))
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = raw.decode().split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    ours = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    recorded = (SSE_DIR / "test_parse_nothing__e2aad469b71d.sse").read_text().split("\n\n")
    theirs = [json.loads(e.removeprefix("data: ")) for e in recorded if e.startswith("data: {")]
    assert list(ours[0]) == list(theirs[0])  # same fields, same order
    assert ours[0]["choices"][0] == {**theirs[0]["choices"][0]}
    assert list(ours[1]["choices"][0]) == list(theirs[1]["choices"][0])
    assert ours[-2]["choices"][0]["delta"] == {} and ours[-2]["choices"][0]["finish_reason"] == "stop"
    assert ours[-1]["choices"] == [] and set(ours[-1]["usage"]) >= set(theirs[-1]["usage"])
    assert ours[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "audio_tokens": 0}


async def test_tool_calls_stream_when_the_header_asks(sim):
    _, url = sim
    stream = await client(url).chat.completions.create(
        model="sim-32k", messages=HELLO, tools=TOOLS, stream=True, extra_headers={"X-Sim-Tool-Calls": "2"}
    )
    calls: dict[int, dict] = {}
    finish = None
    async for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = call["id"] or delta.id
            call["name"] = call["name"] or (delta.function.name if delta.function else None)
            call["arguments"] += (delta.function.arguments or "") if delta.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and len(calls) == 2
    assert all(c["name"] == "bash" and json.loads(c["arguments"]) == {"command": "ls -la"} for c in calls.values())
    assert calls[0]["id"] != calls[1]["id"]


async def test_tool_calls_answered_by_config_flag():
    runner, url = await start_simulator(SimulatorConfig(tool_calls=1))
    try:
        answer = await client(url).chat.completions.create(model="sim-32k", messages=HELLO, tools=TOOLS)
        plain = await client(url).chat.completions.create(model="sim-32k", messages=HELLO)  # no tools offered
    finally:
        await runner.cleanup()
    assert answer.choices[0].finish_reason == "tool_calls"
    assert answer.choices[0].message.tool_calls[0].function.name == "bash"
    assert plain.choices[0].message.content and not plain.choices[0].message.tool_calls


async def test_models_and_embeddings(sim):
    _, url = sim
    models = await client(url).models.list()
    assert "sim-32k" in [m.id for m in models.data]
    base64_default = await client(url).embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    floats = await client(url).embeddings.create(model="text-embedding-3-small", input="a", encoding_format="float")
    assert len(base64_default.data) == 2 and len(floats.data[0].embedding) == 16
    assert base64_default.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-6)


async def test_every_request_is_recorded(sim):
    state, url = sim
    await client(url).chat.completions.create(model="sim-32k", messages=HELLO, extra_headers={"X-Trace": "1"})
    async with aiohttp.ClientSession() as http, http.get(f"{url}/files?purpose=x") as resp:
        assert resp.status == 404 and (await resp.json())["error"]["type"] == "invalid_request_error"
    chat, files = state.requests[-2], state.requests[-1]
    assert chat.method == "POST" and chat.path == "/v1/chat/completions"
    assert chat.headers["authorization"] == "Bearer sk-test" and chat.headers["X-Trace"] == "1"
    assert chat.body["messages"] == HELLO and json.loads(chat.raw) == chat.body
    assert files.path == "/v1/files?purpose=x" and files.body is None
    assert state.totals.requests == state.totals.answered == 1


# --- billing ------------------------------------------------------------------------------------


async def test_cached_tokens_are_the_longest_shared_prefix_in_steps_of_128(sim):
    state, url = sim
    history = [long_message("system", 150, "sys"), long_message("user", 150, "task")]
    first = await client(url).chat.completions.create(model="sim-32k", messages=history, tools=TOOLS)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    grown = [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    second = await client(url).chat.completions.create(model="sim-32k", messages=grown, tools=TOOLS)
    _, chain = state.measure("sim-32k", TOOLS, history)
    assert second.usage.prompt_tokens_details.cached_tokens == chain[-1][1] // 128 * 128 > 1024
    other_key = await client(url, default_headers={"Authorization": "Bearer other"}).chat.completions.create(
        model="sim-32k", messages=grown, tools=TOOLS
    )
    assert other_key.usage.prompt_tokens_details.cached_tokens == 0
    no_tools = await client(url).chat.completions.create(model="sim-32k", messages=grown)
    assert no_tools.usage.prompt_tokens_details.cached_tokens == 0  # the tools schema comes first
    edited = [{**history[0], "content": "changed"}, *grown[1:]]
    miss = await client(url).chat.completions.create(model="sim-32k", messages=edited, tools=TOOLS)
    assert miss.usage.prompt_tokens_details.cached_tokens == 0
    assert state.totals.cached_tokens == second.usage.prompt_tokens_details.cached_tokens
    assert state.totals.prompt_tokens == sum(r.usage.prompt_tokens for r in (first, second, other_key, no_tools, miss))


async def test_no_cache_hit_below_1024_tokens(sim):
    _, url = sim
    small = [long_message("user", 100, "small")]
    for _ in range(2):
        answer = await client(url).chat.completions.create(model="sim-32k", messages=small)
    assert 600 < answer.usage.prompt_tokens < 1024 and answer.usage.prompt_tokens_details.cached_tokens == 0


async def test_prompt_tokens_are_close_to_the_proxy_estimate_but_above_it(sim):
    _, url = sim
    trace = load_trace("marshmallow")
    messages, _ = list(requests(trace))[-1]
    counter = counter_for("o200k_base")
    estimate = sum(counter.count_message(m) for m in messages) + REPLY_PRIMING + tools_tokens(trace.tools, counter)
    billed = (await client(url).chat.completions.create(model="gpt-4o", messages=messages, tools=trace.tools)).usage
    assert estimate < billed.prompt_tokens < estimate * 1.05


# --- refusals -----------------------------------------------------------------------------------


async def test_over_the_window_is_refused_with_openais_exact_error(sim):
    state, url = sim
    messages = [long_message("user", 5600, "big")]
    tokens, _ = state.measure("sim-32k", None, messages)
    assert tokens > 32000
    status, _, raw = await post(url, {"model": "sim-32k", "messages": messages})
    assert status == 400
    assert json.loads(raw) == {
        "error": {
            "message": "This model's maximum context length is 32000 tokens. However, your messages resulted in "
            f"{tokens} tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    with pytest.raises(openai.BadRequestError) as caught:
        await client(url).chat.completions.create(model="sim-32k-0613", messages=messages)
    assert caught.value.code == "context_length_exceeded"
    fits, _ = state.measure("gpt-4o", None, messages)
    assert (await client(url).chat.completions.create(model="gpt-4o", messages=messages)).usage.prompt_tokens == fits
    assert state.totals.refused == 2 and state.totals.answered == 1


async def test_reserved_completion_counts_against_the_window(sim):
    state, url = sim
    messages = [long_message("user", 3200, "reserve")]
    tokens, _ = state.measure("sim-32k", None, messages)
    assert tokens < 32000 < tokens + 8000
    status, _, raw = await post(url, {"model": "sim-32k", "messages": messages, "max_completion_tokens": 8000})
    message = json.loads(raw)["error"]["message"]
    assert status == 400 and f"you requested {tokens + 8000} tokens ({tokens} in the messages, 8000 in" in message


CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {}}]}


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([*HELLO, {"role": "tool", "tool_call_id": "c1", "content": "x"}], "messages.[1].role"),
        ([*HELLO, CALL, {"role": "tool", "tool_call_id": "c2", "content": "x"}], "messages.[2].tool_call_id"),
        ([*HELLO, CALL, *HELLO], "messages.[1].role"),
        ([*HELLO, CALL], "messages.[1].role"),
    ],
    ids=["result-without-call", "result-for-another-call", "call-without-result", "call-at-the-end"],
)
async def test_tool_pairing_is_checked_like_openai(sim, messages, param):
    _, url = sim
    status, _, raw = await post(url, {"model": "sim-32k", "messages": messages})
    error = json.loads(raw)["error"]
    assert status == 400 and error["param"] == param and error["type"] == "invalid_request_error"


async def test_a_body_nested_too_deep_is_a_400_not_a_crash(sim):
    _, url = sim
    deep: dict = {"type": "text", "text": "x"}
    for _ in range(300):
        deep = {"type": "text", "text": "x", "nested": deep}
    status, _, raw = await post(url, {"model": "sim-32k", "messages": [{"role": "user", "content": [deep]}]})
    assert status == 400 and json.loads(raw)["error"]["param"] == "messages"


@pytest.mark.parametrize("options", [True, 3, "usage", [{"include_usage": True}]])
async def test_stream_options_that_are_not_an_object_are_a_400_not_a_crash(sim, options):
    """As OpenAI answers it; the proxy forwards such a body as sent when it leaves the turn unedited."""
    _, url = sim
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": "sim-32k", "stream": True, "stream_options": options, "messages": messages}
    status, _, raw = await post(url, body)
    assert status == 400 and json.loads(raw)["error"]["param"] == "stream_options"


def test_every_request_of_every_trace_pairs_correctly():
    for name in list_traces():
        trace = load_trace(name)
        assert all(pairing_error(messages) is None for messages, _ in requests(trace)), name
    reused = [*HELLO, CALL, {"role": "tool", "tool_call_id": "c1", "content": "x"}, CALL]
    assert pairing_error([*reused, {"role": "tool", "tool_call_id": "c1", "content": "y"}]) is None


# --- faults -------------------------------------------------------------------------------------


def fault(name: str, **extra) -> dict[str, str]:
    return {"X-Sim-Fault": name, **extra}


async def test_reset_before_headers_drops_the_connection(sim):
    _, url = sim
    with pytest.raises(aiohttp.ClientConnectionError):
        await post(url, chat_body(), fault("reset-before-headers"))
    with pytest.raises(openai.APIConnectionError):
        await client(url).chat.completions.create(
            model="sim-32k", messages=HELLO, extra_headers=fault("reset-before-headers")
        )


@pytest.mark.parametrize("stream", [True, False])
async def test_reset_mid_stream_ends_the_body_early(sim, stream):
    _, url = sim
    received = b""
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/chat/completions", json=chat_body(stream=stream), headers=fault("reset-mid-stream")) as resp,
    ):
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for piece in resp.content.iter_any():
                received += piece
    assert received and b"[DONE]" not in received


@pytest.mark.parametrize("name", ["silence", "silence-mid-stream"])
async def test_silence_outlasts_the_client_and_ends_when_it_leaves(sim, name):
    state, url = sim
    started = time.monotonic()
    with pytest.raises((asyncio.TimeoutError, aiohttp.ClientPayloadError)):
        await post(url, chat_body(stream=True), fault(name), timeout=aiohttp.ClientTimeout(sock_read=0.3))
    assert 0.3 <= time.monotonic() - started < 2
    for _ in range(50):
        if state.active_streams == 0:
            break
        await asyncio.sleep(0.02)
    assert state.active_streams == 0


async def test_slow_headers_delays_then_answers(sim):
    _, url = sim
    started = time.monotonic()
    status, _, raw = await post(url, chat_body(), fault("slow-headers"))
    assert status == 200 and json.loads(raw)["choices"] and time.monotonic() - started >= 0.3


async def test_malformed_sse_breaks_one_event(sim):
    _, url = sim
    status, _, raw = await post(url, chat_body(stream=True), fault("malformed-sse"))
    events = [e.removeprefix("data: ") for e in raw.decode().split("\n\n") if e]
    broken = []
    for event in events[:-1]:
        try:
            json.loads(event)
        except json.JSONDecodeError:
            broken.append(event)
    assert status == 200 and len(broken) == 1 and events[-1] == "[DONE]"


async def test_non_json_error_is_a_502_html_page(sim):
    _, url = sim
    status, headers, raw = await post(url, chat_body(), fault("non-json-error"))
    assert status == 502 and headers["Content-Type"].startswith("text/html") and raw.startswith(b"<html>")


@pytest.mark.parametrize(
    ("name", "status", "error"),
    [("status-401", 401, openai.AuthenticationError), ("status-429", 429, openai.RateLimitError),
     ("status-500", 500, openai.InternalServerError), ("status-503", 503, openai.InternalServerError)],
)  # fmt: skip
async def test_status_faults_answer_in_openais_shape(sim, name, status, error):
    state, url = sim
    got, headers, raw = await post(url, chat_body(), fault(name))
    body = json.loads(raw)["error"]
    assert got == status and list(body) == ["message", "type", "param", "code"]
    assert (headers.get("retry-after") == "1") == (status == 429)
    assert (headers.get("x-ratelimit-remaining-requests") == "0") == (status == 429)
    with pytest.raises(error):
        await client(url).chat.completions.create(model="sim-32k", messages=HELLO, extra_headers=fault(name))
    assert state.totals.requests == 0  # refused before the model ever saw it


async def test_an_unknown_fault_is_a_400_not_a_silent_success(sim):
    _, url = sim
    status, _, raw = await post(url, chat_body(), fault("reset-before-header"))
    assert status == 400 and "unknown X-Sim-Fault" in json.loads(raw)["error"]["message"]


async def test_a_client_that_leaves_mid_stream_is_counted_at_once(sim):
    state, url = sim
    async with aiohttp.ClientSession() as http:
        resp = await http.post(
            f"{url}/chat/completions", json=chat_body(stream=True), headers={"X-Sim-Delay-Ms": "500"}
        )
        await resp.content.readline()
        resp.close()
    for _ in range(50):
        if state.totals.disconnects:
            break
        await asyncio.sleep(0.02)
    assert state.totals.disconnects == 1 and state.active_streams == 0


@pytest.mark.parametrize(
    "extra",
    [
        {"max_completion_tokens": [None]},
        {"max_tokens": {"a": 1}},
        {"max_tokens": 0},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": {"x": 1}}]}]},
    ],
)
async def test_malformed_fields_get_the_apis_400_not_a_crash(extra) -> None:
    """Found by the hostile-input test through the proxy: the simulator answered 500 to these."""
    runner, url = await start_simulator()
    try:
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], **extra}
        async with aiohttp.ClientSession() as http, http.post(url + "/chat/completions", json=body) as response:
            assert response.status == 400, await response.text()
            assert "error" in await response.json()
    finally:
        await runner.cleanup()
