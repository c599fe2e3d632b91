"""Every other /v1 route forwarded verbatim; the operational routes answered by the proxy itself."""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
import openai

from proxy.demo.simulator import SimulatorConfig
from tests.conftest import RecordingService
from tests.harness import settle

MODEL = "gpt-4o-mini"


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="sk-client", max_retries=0, timeout=10)


async def test_models_and_embeddings_pass_through_the_sdk(rig):
    models = await client(rig.base_url).models.list()
    assert [m.id for m in models.data] == list(rig.sim.config.models)
    embedding = await client(rig.base_url).embeddings.create(model="text-embedding-3-small", input="hi")
    direct = await client(rig.sim_url).embeddings.create(model="text-embedding-3-small", input="hi")
    assert embedding.data[0].embedding == direct.data[0].embedding
    proxied = rig.sim.requests[-2]
    assert proxied.method == "POST" and proxied.path == "/v1/embeddings"


async def test_session_prefixed_passthrough_routes_drop_the_prefix(rig):
    await client(f"{rig.root}/s/agent-1/v1").models.list()
    assert rig.sim.requests[-1].path == "/v1/models"


async def test_any_method_path_and_query_string_are_kept_verbatim(rig):
    async with aiohttp.ClientSession() as http:
        for method in ("GET", "DELETE", "PATCH", "PUT"):
            url = f"{rig.base_url}/files/a%2Fb?limit=2&after=x%20y"
            async with http.request(method, aiohttp.client.URL(url, encoded=True)) as response:
                assert response.status == 404  # the simulator's answer, relayed
                assert f"({method} /v1/files/a/b)" in (await response.json())["error"]["message"]
            seen = rig.sim.requests[-1]
            assert seen.method == method
            assert seen.path == "/v1/files/a%2Fb?limit=2&after=x%20y"


async def test_request_bodies_stream_to_the_upstream_before_they_end(rig):
    pieces = [b"a" * 5000, b"b" * 7000]

    async def body():
        yield pieces[0]
        # If the proxy read the body whole, the upstream could not see the first piece yet.
        assert await settle(lambda: rig.sim.body_bytes >= len(pieces[0]), timeout=5)
        yield pieces[1]

    async with aiohttp.ClientSession() as http, http.post(f"{rig.base_url}/files", data=body()) as response:
        await response.read()
    seen = rig.sim.requests[-1]
    assert len(seen.raw) == 12000
    assert hashlib.sha256(seen.raw).hexdigest() == hashlib.sha256(b"".join(pieces)).hexdigest()


async def test_hop_by_hop_headers_are_dropped_both_ways(make_rig):
    rig = await make_rig(sim_config=SimulatorConfig(extra_headers={"X-Served-By": "sim", "Keep-Alive": "timeout=5"}))
    headers = {"Connection": "keep-alive, X-Drop-Me", "X-Drop-Me": "1", "Keep-Alive": "timeout=5", "X-Keep": "1"}
    async with aiohttp.ClientSession() as http, http.get(f"{rig.base_url}/models", headers=headers) as response:
        assert response.headers["X-Served-By"] == "sim"
        assert "Keep-Alive" not in response.headers
    seen = rig.sim.requests[-1].headers
    assert seen["X-Keep"] == "1"
    assert "X-Drop-Me" not in seen and "Keep-Alive" not in seen


async def test_neither_host_header_nor_absolute_target_can_redirect_the_proxy(rig):
    host, port = rig.root.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET http://evil.example/v1/models HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
    await writer.drain()
    reply = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert reply.startswith(b"HTTP/1.1 200")
    upstream_host = rig.sim_url.removeprefix("http://").removesuffix("/v1")
    assert rig.sim.requests[-1].headers["Host"] == upstream_host


async def test_dot_segments_cannot_climb_out_of_v1(rig):
    async with aiohttp.ClientSession() as http:
        url = aiohttp.client.URL(f"{rig.base_url}/%2e%2e/admin", encoded=True)
        async with http.get(url) as response:
            assert response.status == 400
    assert list(rig.sim.requests) == []


async def test_healthz_answers_without_the_upstream(make_rig):
    rig = await make_rig(upstream_url="http://127.0.0.1:9/v1")
    async with aiohttp.ClientSession() as http, http.get(f"{rig.root}/healthz") as response:
        assert response.status == 200 and (await response.json())["status"] == "ok"


async def test_metrics_count_requests_latency_and_streams(rig):
    await client(rig.base_url).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    await client(rig.base_url).models.list()
    async with aiohttp.ClientSession() as http, http.get(f"{rig.root}/metrics") as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await response.text()
    assert 'context_proxy_requests_total{route="chat_completions",status="200"}' in text
    assert 'context_proxy_requests_total{route="passthrough",status="200"}' in text
    assert 'context_proxy_upstream_latency_seconds_bucket{route="chat",le="+Inf"}' in text
    assert "context_proxy_streams_in_flight 0" in text


async def test_sessions_routes_need_a_service_that_keeps_sessions(rig, make_rig):
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{rig.root}/sessions") as response:
            assert response.status == 404
        service = RecordingService()
        keeping = await make_rig(context=service)
        await client(f"{keeping.root}/s/run-9/v1").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        async with http.get(f"{keeping.root}/sessions") as response:
            assert await response.json() == [{"id": "run-9"}]
        async with http.get(f"{keeping.root}/sessions/run-9") as response:
            assert await response.json() == {"id": "run-9"}
        async with http.get(f"{keeping.root}/sessions/other") as response:
            assert response.status == 404


async def test_admin_routes_need_the_admin_token_when_one_is_configured(make_rig, monkeypatch):
    monkeypatch.setenv("FAKE_ADMIN_TOKEN", "let-me-in")
    rig = await make_rig(server={"admin_token_env": "FAKE_ADMIN_TOKEN"})
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{rig.root}/metrics") as response:
            assert response.status == 401
        async with http.get(f"{rig.root}/metrics", headers={"Authorization": "Bearer let-me-in"}) as response:
            assert response.status == 200
