"""Keys and access: who may use the proxy, what reaches the upstream, what never reaches the client or the logs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from proxy.demo.simulator import SimulatorConfig
from proxy.errors import ProxyError
from proxy.shell.access import ADMIN_COOKIE, check_request, exposure_problem
from tests.harness import ENGINES, Rig, chat_body, is_openai_error, make_settings, start_rig

PROXY_KEYS = ("pk-alpha-7d1f0c2e", "pk-beta-93ab44e1")
UPSTREAM_KEY = "sk-upstream-PLANTED-5e6f7a8b9c"
CLIENT_UPSTREAM_KEY = "sk-client-PLANTED-0a1b2c3d"
ADMIN_TOKEN = "adm-PLANTED-4c4c4c4c"
PROMPT = "PROMPT-PLANTED-the-launch-code-is-swordfish"
COMPLETION = "COMPLETION-PLANTED-the-answer-is-forty-two"
REMOTE_HEADER = "X-Test-Remote"


@web.middleware
async def fake_remote(request: web.Request, handler):
    """Tests only: pretend the client connected from the address in X-Test-Remote (loopback is all we bind)."""
    remote = request.headers.get(REMOTE_HEADER)
    return await handler(request.clone(remote=remote) if remote else request)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CP_TEST_PROXY_KEYS", ",".join(PROXY_KEYS))
    monkeypatch.setenv("CP_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    monkeypatch.setenv("CP_TEST_ADMIN", ADMIN_TOKEN)


async def keyed_rig(*, upstream_key: bool = True, engine: bool = False, **sections) -> Rig:
    return await start_rig(
        sim_config=SimulatorConfig(answer=COMPLETION),
        engine=engine,
        outer=(fake_remote,),
        auth={"keys_env": "CP_TEST_PROXY_KEYS"},
        upstream={"api_key_env": "CP_TEST_UPSTREAM_KEY" if upstream_key else ""},
        **sections,
    )


async def post(rig: Rig, headers: dict, body: dict | None = None, path: str = "/v1/chat/completions"):
    async with (
        aiohttp.ClientSession() as client,
        client.post(rig.root + path, json=body or chat_body(PROMPT), headers=headers) as response,
    ):
        return response.status, dict(response.headers), await response.read()


def everything_upstream_saw(rig: Rig) -> str:
    return "\n".join(f"{r.path} {list(r.headers.items())} {r.raw!r}" for r in rig.sim.requests)


# ---- access keys --------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer pk-wrong"}, {"Authorization": PROXY_KEYS[0]}])
async def test_without_a_valid_access_key_nothing_is_forwarded(env, headers: dict) -> None:
    rig = await keyed_rig()
    try:
        status, _, data = await post(rig, headers)
        assert status == 401
        assert is_openai_error(json.loads(data))
        status, _, _ = await post(rig, headers, path="/v1/embeddings", body={"model": "m", "input": "x"})
        assert status == 401
        assert not rig.sim.requests
    finally:
        await rig.close()


async def test_with_an_access_key_the_upstream_gets_the_injected_key_and_never_the_proxy_key(env) -> None:
    openai = pytest.importorskip("openai")
    rig = await keyed_rig()
    try:
        client = openai.AsyncOpenAI(base_url=rig.base_url, api_key=PROXY_KEYS[1], max_retries=0, timeout=10)
        async with client:
            answer = await client.chat.completions.create(**chat_body(PROMPT))
            stream = await client.chat.completions.create(**chat_body(PROMPT, stream=True))
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert answer.choices[0].message.content == COMPLETION == text
        assert [r.headers["Authorization"] for r in rig.sim.requests] == [f"Bearer {UPSTREAM_KEY}"] * 2
        assert PROXY_KEYS[1] not in everything_upstream_saw(rig)
    finally:
        await rig.close()


async def test_x_proxy_key_lets_a_client_bring_its_own_upstream_key(env) -> None:
    rig = await keyed_rig(upstream_key=False)
    try:
        headers = {"Authorization": f"Bearer {CLIENT_UPSTREAM_KEY}", "X-Proxy-Key": PROXY_KEYS[0]}
        status, _, _ = await post(rig, headers)
        assert status == 200
        assert rig.sim.requests[-1].headers["Authorization"] == f"Bearer {CLIENT_UPSTREAM_KEY}"
        assert PROXY_KEYS[0] not in everything_upstream_saw(rig)
    finally:
        await rig.close()


async def test_a_proxy_key_sent_as_bearer_is_not_forwarded_when_no_upstream_key_is_configured(env) -> None:
    rig = await keyed_rig(upstream_key=False)
    try:
        status, _, _ = await post(rig, {"Authorization": f"Bearer {PROXY_KEYS[0]}"})
        assert status < 500
        assert "Authorization" not in rig.sim.requests[-1].headers
        assert PROXY_KEYS[0] not in everything_upstream_saw(rig)
    finally:
        await rig.close()


async def test_health_stays_open_behind_access_keys(env) -> None:
    rig = await keyed_rig()
    try:
        async with aiohttp.ClientSession() as client, client.get(rig.root + "/healthz") as response:
            assert response.status == 200
    finally:
        await rig.close()


@pytest.mark.parametrize("fault", ["", "status-401", "status-500", "reset-mid-stream"])
async def test_the_upstream_key_is_never_returned_to_the_client(env, fault: str) -> None:
    rig = await keyed_rig()
    try:
        headers = {"Authorization": f"Bearer {PROXY_KEYS[0]}", "X-Sim-Fault": fault}
        for stream in (False, True):
            try:
                _, response_headers, data = await post(rig, headers, chat_body(PROMPT, stream=stream))
            except aiohttp.ClientPayloadError:
                continue  # the broken stream: nothing came back to inspect beyond what is checked below
            assert UPSTREAM_KEY not in f"{response_headers} {data!r}"
    finally:
        await rig.close()


# ---- admin routes -------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/metrics", "/sessions", "/sessions/some-id"])
async def test_admin_routes_refuse_non_loopback_clients_without_a_token(route: str) -> None:
    rig = await start_rig(outer=(fake_remote,))
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(rig.root + route, headers={REMOTE_HEADER: "203.0.113.9"}) as response:
                assert response.status in (401, 403)
                assert is_openai_error(await response.json())
            async with client.get(rig.root + "/metrics") as response:
                assert response.status == 200  # loopback, no token configured: the operator's own machine
    finally:
        await rig.close()


@pytest.mark.parametrize("route", ["/metrics", "/sessions"])
async def test_admin_routes_need_the_admin_token_when_one_is_configured(env, route: str) -> None:
    rig = await keyed_rig(server={"admin_token_env": "CP_TEST_ADMIN"})
    try:
        remote = {REMOTE_HEADER: "203.0.113.9"}
        for headers, expected in [
            ({}, 401),
            ({"Authorization": f"Bearer {PROXY_KEYS[0]}"}, 401),  # an access key is not an admin token
            ({"Authorization": f"Bearer {ADMIN_TOKEN}x"}, 401),
            ({"Authorization": f"Bearer {ADMIN_TOKEN}"}, None),
        ]:
            status, _, _ = await post_get(rig, route, {**remote, **headers})
            if expected is None:  # let in (the pass-through engine keeps no sessions: 404)
                assert status in (200, 404), headers
            else:
                assert status == expected, headers
    finally:
        await rig.close()


async def post_get(rig: Rig, route: str, headers: dict):
    async with aiohttp.ClientSession() as client, client.get(rig.root + route, headers=headers) as response:
        return response.status, dict(response.headers), await response.read()


def test_binding_off_loopback_without_an_admin_token_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings("http://127.0.0.1:1/v1")
    assert exposure_problem("127.0.0.1", settings) is None
    assert exposure_problem("::1", settings) is None
    assert "admin_token_env" in exposure_problem("0.0.0.0", settings)
    with_token = make_settings("http://127.0.0.1:1/v1", server={"admin_token_env": "CP_TEST_ADMIN"})
    assert exposure_problem("0.0.0.0", with_token) is not None  # named, but the variable is empty
    monkeypatch.setenv("CP_TEST_ADMIN", ADMIN_TOKEN)
    assert exposure_problem("0.0.0.0", with_token) is None


# ---- header injection and redirection -----------------------------------------------------------


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "a\nX-Injected: 1", "a\rb", "a\x00b"])
def test_line_breaks_in_header_values_are_refused(value: str) -> None:
    request = make_mocked_request("POST", "/v1/chat/completions", headers=CIMultiDict({"X-Custom": value}))
    verdict = check_request(request, make_settings("http://127.0.0.1:1/v1"))
    assert isinstance(verdict, ProxyError) and verdict.status == 400


@pytest.mark.parametrize(
    "raw_header",
    [b"X-Custom: a\r\n folded: continuation", b"X-Custom: a\rX-Injected: 1", b"X-Custom: a\nX-Injected: 1"],
)
async def test_line_breaks_on_the_wire_never_reach_the_upstream(raw_header: bytes) -> None:
    rig = await start_rig()
    try:
        body = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'
        reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + raw_header
            + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        status = int(status_line.split()[1])
        assert status == 400 or all("X-Injected" not in r.headers for r in rig.sim.requests)
        assert all("\r" not in v and "\n" not in v for r in rig.sim.requests for v in r.headers.values())
    finally:
        await rig.close()


async def _start_bystander() -> tuple[web.AppRunner, int, list]:
    """A second local server: if the proxy can be pointed at it, it will see the request."""
    seen: list = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.path_qs)
        return web.json_response({"bystander": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1], seen


async def test_request_targets_and_host_headers_cannot_redirect_the_proxy() -> None:
    bystander, port, seen = await _start_bystander()
    rig = await start_rig()
    rig.extra.append(bystander)
    elsewhere = f"127.0.0.1:{port}"
    body = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'
    attempts = [
        f"POST http://{elsewhere}/v1/chat/completions HTTP/1.1\r\nHost: {elsewhere}",
        f"GET http://{elsewhere}/v1/models HTTP/1.1\r\nHost: {elsewhere}",
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {elsewhere}",
        f"GET /v1/models HTTP/1.1\r\nHost: {elsewhere}\r\nX-Forwarded-Host: {elsewhere}",
        f"GET //{elsewhere}/v1/models HTTP/1.1\r\nHost: x",
        f"GET /v1//{elsewhere}/models HTTP/1.1\r\nHost: x",
        f"GET /v1/@{elsewhere}/models HTTP/1.1\r\nHost: x",
        f"GET /v1/http://{elsewhere}/models HTTP/1.1\r\nHost: x",
        f"GET /v1/..%2f..%2f{elsewhere}/models HTTP/1.1\r\nHost: x",
        f"CONNECT {elsewhere} HTTP/1.1\r\nHost: {elsewhere}",
    ]
    try:
        for head in attempts:
            reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
            payload = body if head.startswith("POST") else b""
            writer.write(
                head.encode() + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(payload) + payload
            )
            await writer.drain()
            await asyncio.wait_for(reader.read(), 5)
            writer.close()
        assert seen == []
        assert all(r.path.startswith("/v1/") for r in rig.sim.requests)
    finally:
        await rig.close()


# ---- logs and session isolation -----------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
async def test_no_key_prompt_or_completion_text_in_the_logs(env, caplog, engine: bool) -> None:
    caplog.set_level(logging.INFO)  # the CLI's default level
    rig = await keyed_rig(engine=engine)
    try:
        good = {"Authorization": f"Bearer {PROXY_KEYS[0]}"}
        for headers in ({}, {"Authorization": f"Bearer {CLIENT_UPSTREAM_KEY}"}, good):
            await post(rig, headers)
        for fault in ("", "status-401", "status-500", "non-json-error", "reset-before-headers", "reset-mid-stream"):
            for stream in (False, True):
                with contextlib.suppress(aiohttp.ClientPayloadError):
                    await post(rig, {**good, "X-Sim-Fault": fault}, chat_body(PROMPT, stream=stream))
        await post(rig, good, {"model": "gpt-4o", "messages": [{"role": "wizard", "content": PROMPT}]})
        await post(rig, good, {"model": "m", "input": PROMPT}, path=f"/v1/embeddings?api-key={CLIENT_UPSTREAM_KEY}")
        await post_get(rig, "/sessions", {})
    finally:
        await rig.close()
    logged = caplog.text + "\n".join(str(r.args) for r in caplog.records)
    assert caplog.records, "nothing was logged: the test would prove nothing"
    for secret in (*PROXY_KEYS, UPSTREAM_KEY, CLIENT_UPSTREAM_KEY, PROMPT, COMPLETION):
        assert secret not in logged, secret


async def test_a_session_is_never_shared_across_credentials(env) -> None:
    rig = await keyed_rig(engine=True, upstream_key=False)
    try:
        conversation = {
            "model": "gpt-4o",
            "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPT}],
        }
        for user_key in (CLIENT_UPSTREAM_KEY, CLIENT_UPSTREAM_KEY + "-other"):
            headers = {"Authorization": f"Bearer {user_key}", "X-Proxy-Key": PROXY_KEYS[0]}
            status, _, _ = await post(rig, headers, conversation)
            assert status == 200
        rows = await rig.context.sessions_json()
        assert len(rows) == 2, "two users with the same prompts landed in one session"
        for row in rows:
            status, _, data = await post_get(rig, f"/sessions/{row['id']}", {})
            assert status == 200 and PROMPT.encode() not in data
    finally:
        await rig.close()


async def test_clients_with_different_proxy_keys_never_share_a_session(env) -> None:
    """With access keys and no upstream key the proxy key is stripped; it still tells the clients apart."""
    rig = await keyed_rig(engine=True, upstream_key=False)
    try:
        conversation = {
            "model": "gpt-4o",
            "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPT}],
        }
        for proxy_key in PROXY_KEYS[:2]:
            status, _, _ = await post(rig, {"Authorization": f"Bearer {proxy_key}"}, conversation)
            assert status == 200
        assert len(await rig.context.sessions_json()) == 2
    finally:
        await rig.close()


@pytest.mark.parametrize(
    ("method", "path", "shape"),
    [
        ("POST", "/v1/chat/completions", "openai"),
        ("POST", "/v1/responses", "openai"),
        ("POST", "/v1/messages", "anthropic"),
        ("GET", "/sessions", "openai"),
        ("GET", "/metrics", "openai"),
    ],
)
@pytest.mark.parametrize("header", [b"Authorization: Bearer pk-\xff\xfe", b"X-Api-Key: caf\xe9", b"X-Custom: \xc3("])
async def test_a_header_byte_that_is_not_utf8_gets_a_400_in_the_routes_shape(
    env, method: str, path: str, shape: str, header: bytes
) -> None:
    """With access keys and an admin token on, the keys are compared as UTF-8: a stray byte is the client's
    mistake, answered as one, never aiohttp's plain-text 500 with a traceback."""
    rig = await keyed_rig(server={"admin_token_env": "CP_TEST_ADMIN"})
    try:
        body = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'
        reader, writer = await asyncio.open_connection("127.0.0.1", rig.port)
        head = b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" % (method.encode(), path.encode())
        writer.write(head + header + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.split()[1] == b"400", answer[:300]
        error = json.loads(payload)
        if shape == "anthropic":
            assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        else:
            assert is_openai_error(error)
        assert b"Traceback" not in answer and not rig.sim.requests
    finally:
        await rig.close()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models"])
async def test_the_admin_cookie_a_browser_holds_never_goes_upstream(env, path: str) -> None:
    """A browser that opened the dashboard holds the admin token as a cookie for the proxy's whole origin and
    sends it with any request there: on the rewritten routes and the passthrough ones alike, the upstream gets
    the client's other cookies and never that one."""
    rig = await keyed_rig(engine=True, server={"admin_token_env": "CP_TEST_ADMIN"})
    try:
        key = {"Authorization": f"Bearer {PROXY_KEYS[0]}"}
        sent = [
            (f"theme=dark; {ADMIN_COOKIE}={ADMIN_TOKEN}; lang=en", "theme=dark; lang=en"),
            (f"{ADMIN_COOKIE}={ADMIN_TOKEN}", None),
            ("theme=dark", "theme=dark"),
        ]
        for cookie, forwarded in sent:
            async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as client:
                headers = {**key, "Cookie": cookie}
                if path == "/v1/models":
                    request = client.get(rig.root + path, headers=headers)
                else:
                    request = client.post(rig.root + path, json=chat_body(PROMPT), headers=headers)
                async with request as response:
                    assert response.status == 200, await response.text()
            seen = rig.sim.requests[-1]
            assert seen.path == path and seen.headers.get("Cookie") == forwarded
            assert ADMIN_TOKEN not in str(dict(seen.headers)) and ADMIN_TOKEN not in seen.raw.decode()
    finally:
        await rig.close()
