"""Proxy access keys as Anthropic clients send them, and the proxy's own errors in Anthropic's shape.

The Anthropic SDK and Claude Code send their key as `x-api-key`, OAuth clients as `Authorization: Bearer`:
either may carry the proxy's access key, which never reaches the upstream. The client is the official
`anthropic` SDK; the upstream is the simulator, which records every request it got.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import anthropic
import pytest

from tests.harness import Rig, closed_port, is_openai_error, start_rig

PROXY_KEY = "pk-anthropic-PLANTED-31c7"
UPSTREAM_KEY = "sk-ant-upstream-PLANTED-9d2e"
CLIENT_KEY = "sk-ant-client-PLANTED-47aa"
HELLO: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}]}


@pytest.fixture
async def keyed(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Callable[..., Awaitable[Rig]]]:
    """A proxy behind access keys in front of the simulator; `upstream_key`: the proxy's own Anthropic key is set."""
    monkeypatch.setenv("CP_TEST_PROXY_KEYS", f"pk-other-1,{PROXY_KEY}")
    monkeypatch.setenv("CP_TEST_ANTHROPIC_KEY", UPSTREAM_KEY)
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):  # the SDK would send them
        monkeypatch.delenv(name, raising=False)
    rigs: list[Rig] = []

    async def make(upstream_key: bool = True, **options: Any) -> Rig:
        rigs.append(
            await start_rig(
                engine=True,
                auth={"keys_env": "CP_TEST_PROXY_KEYS"},
                anthropic={"api_key_env": "CP_TEST_ANTHROPIC_KEY" if upstream_key else ""},
                **options,
            )
        )
        return rigs[-1]

    yield make
    for rig in rigs:
        await rig.close()


def client(rig: Rig, path: str = "", **kwargs: Any) -> anthropic.AsyncAnthropic:
    """The SDK as configured (this SDK sends `api_key` as a Bearer token)."""
    return anthropic.AsyncAnthropic(base_url=rig.root + path, max_retries=0, timeout=10, **kwargs)


def claude_code(rig: Rig, path: str = "", key: str = PROXY_KEY, **headers: str) -> anthropic.AsyncAnthropic:
    """The SDK sending its key as `x-api-key`, as Claude Code and earlier SDKs do."""
    return client(rig, path, default_headers={"x-api-key": key, **headers})


def everything_upstream_saw(rig: Rig) -> str:
    return "\n".join(f"{r.path} {list(r.headers.items())} {r.raw!r}" for r in rig.sim.requests)


async def test_the_proxy_key_as_x_api_key_lets_the_anthropic_sdk_in_and_stays_behind(keyed: Any) -> None:
    rig = await keyed()
    async with claude_code(rig) as plain, claude_code(rig, "/s/work") as named:
        reply = await plain.messages.create(**HELLO)
        async with named.messages.stream(**HELLO) as stream:
            streamed = await stream.get_final_message()
        counted = await named.messages.count_tokens(model=HELLO["model"], messages=HELLO["messages"])
    assert reply.stop_reason == streamed.stop_reason == "end_turn" and counted.input_tokens > 0
    paths = [r.path for r in rig.sim.requests]
    assert paths == ["/v1/messages", "/v1/messages", "/v1/messages/count_tokens"]
    assert [r.headers.getall("x-api-key") for r in rig.sim.requests] == [[UPSTREAM_KEY]] * 3
    assert all("Authorization" not in r.headers for r in rig.sim.requests)
    assert PROXY_KEY not in everything_upstream_saw(rig)


@pytest.mark.parametrize("credential", ["api_key", "auth_token"])
async def test_the_proxy_key_as_a_bearer_token_works_the_same(keyed: Any, credential: str) -> None:
    rig = await keyed()
    async with client(rig, **{credential: PROXY_KEY}) as oauth:
        reply = await oauth.messages.create(**HELLO)
    assert reply.stop_reason == "end_turn"
    assert rig.sim.requests[-1].headers.getall("x-api-key") == [UPSTREAM_KEY]
    assert "Authorization" not in rig.sim.requests[-1].headers
    assert PROXY_KEY not in everything_upstream_saw(rig)


@pytest.mark.parametrize(
    ("credential", "openai_key"), [("x-api-key", False), ("bearer", False), ("bearer", True)]
)  # an OpenAI upstream key replaces a Bearer token on OpenAI's routes, not on Anthropic's
async def test_without_an_anthropic_key_configured_the_proxy_key_is_still_not_forwarded(
    keyed: Any, credential: str, openai_key: bool
) -> None:
    rig = await keyed(upstream_key=False, upstream={"api_key_env": "CP_TEST_ANTHROPIC_KEY" if openai_key else ""})
    async with claude_code(rig) if credential == "x-api-key" else client(rig, api_key=PROXY_KEY) as sdk:
        await sdk.messages.create(**HELLO)
    assert "x-api-key" not in rig.sim.requests[-1].headers and "Authorization" not in rig.sim.requests[-1].headers
    assert PROXY_KEY not in everything_upstream_saw(rig)


async def test_x_proxy_key_lets_an_anthropic_client_bring_its_own_key(keyed: Any) -> None:
    rig = await keyed(upstream_key=False)
    async with claude_code(rig, key=CLIENT_KEY, **{"X-Proxy-Key": PROXY_KEY}) as sdk:
        await sdk.messages.create(**HELLO)
    assert rig.sim.requests[-1].headers.getall("x-api-key") == [CLIENT_KEY]
    assert PROXY_KEY not in everything_upstream_saw(rig)


def is_anthropic_error(payload: Any, error_type: str) -> bool:
    """Anthropic's error shape: {"type": "error", "error": {"type": ..., "message": str}}."""
    error = payload.get("error") if isinstance(payload, dict) else None
    return (
        payload.get("type") == "error"
        and isinstance(error, dict)
        and error.get("type") == error_type
        and isinstance(error.get("message"), str)
    )


@pytest.mark.parametrize("path", ["", "/s/work"])
async def test_a_wrong_key_is_refused_in_anthropics_shape_on_every_anthropic_route(keyed: Any, path: str) -> None:
    rig = await keyed()
    async with claude_code(rig, path, key="pk-wrong") as sdk:
        with pytest.raises(anthropic.AuthenticationError) as created:
            await sdk.messages.create(**HELLO)
        with pytest.raises(anthropic.AuthenticationError) as counted:
            await sdk.messages.count_tokens(model=HELLO["model"], messages=HELLO["messages"])
    for refused in (created.value, counted.value):
        assert is_anthropic_error(refused.body, "authentication_error"), refused.body
        assert "x-api-key" in refused.body["error"]["message"]
    assert not rig.sim.requests


async def test_a_missing_key_is_refused_in_anthropics_shape_and_chat_keeps_openais(keyed: Any) -> None:
    rig = await keyed()
    async with aiohttp.ClientSession() as http:
        async with http.post(rig.root + "/v1/messages", json=HELLO) as response:
            messages = (response.status, await response.json())
        async with http.get(rig.root + "/v1/models", headers={"anthropic-version": "2023-06-01"}) as response:
            models = (response.status, await response.json())
        chat = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(rig.root + "/v1/chat/completions", json=chat) as response:
            chat_refusal = (response.status, await response.json())
    assert messages[0] == models[0] == chat_refusal[0] == 401
    assert is_anthropic_error(messages[1], "authentication_error")
    assert is_anthropic_error(models[1], "authentication_error")
    assert is_openai_error(chat_refusal[1])
    assert not rig.sim.requests


async def test_the_proxys_other_errors_on_anthropic_routes_are_in_anthropics_shape(keyed: Any) -> None:
    """An unreachable upstream (502) on the rewritten route and on a forwarded one, a body too large (413)."""
    rig = await keyed(upstream_url=f"http://127.0.0.1:{closed_port()}/v1", server={"max_body_mb": 0.01})  # ~10 KB
    async with claude_code(rig) as sdk:
        with pytest.raises(anthropic.APIStatusError) as created:
            await sdk.messages.create(**HELLO)
        with pytest.raises(anthropic.APIStatusError) as counted:
            await sdk.messages.count_tokens(model=HELLO["model"], messages=HELLO["messages"])
        huge = [{"role": "user", "content": "x" * 20_000}]
        with pytest.raises(anthropic.APIStatusError) as too_large:
            await sdk.messages.create(model=HELLO["model"], max_tokens=64, messages=huge)
    assert created.value.status_code == counted.value.status_code == 502
    assert is_anthropic_error(created.value.body, "api_error") and is_anthropic_error(counted.value.body, "api_error")
    assert too_large.value.status_code == 413 and is_anthropic_error(too_large.value.body, "request_too_large")
