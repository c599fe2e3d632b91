"""A client reaches only the sessions its own credential scopes: the proxy's key forms are never taken from outside."""

from __future__ import annotations

import aiohttp
import pytest

from tests.harness import chat_body, start_rig


@pytest.fixture
async def rig():
    rig = await start_rig(engine=True)  # no access keys: the open proxy, where the credential is the client's token
    yield rig
    await rig.close()


async def _chat(client: aiohttp.ClientSession, url: str, text: str, token: str | None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with client.post(url, json=chat_body(text), headers=headers) as response:
        assert response.status == 200, await response.text()


async def _sessions(client: aiohttp.ClientSession, root: str) -> dict[str, int]:
    async with client.get(f"{root}/sessions") as response:
        return {row["key"]: row["turns"] for row in await response.json()}


@pytest.mark.parametrize("token", [None, "sk-other"], ids=["no-credential", "other-credential"])
async def test_another_clients_scoped_session_key_cannot_be_addressed(rig, token: str | None) -> None:
    async with aiohttp.ClientSession() as client:
        await _chat(client, f"{rig.root}/s/s1/v1/chat/completions", "Mine.", "sk-victim")
        (victim_key,) = await _sessions(client, rig.root)
        assert "@" in victim_key
        await _chat(client, f"{rig.root}/s/{victim_key}/v1/chat/completions", "Intruder.", token)
        sessions = await _sessions(client, rig.root)
    assert sessions[victim_key] == 1  # the intruder's turn went into a session of its own
    assert len(sessions) == 2


@pytest.mark.parametrize("token", [None, "sk-other"], ids=["no-credential", "other-credential"])
async def test_another_clients_fingerprinted_session_cannot_be_named(rig, token: str | None) -> None:
    async with aiohttp.ClientSession() as client:
        await _chat(client, f"{rig.base_url}/chat/completions", "Mine.", "sk-victim")
        (victim_key,) = await _sessions(client, rig.root)
        assert victim_key.startswith("fp-")
        headers = {"X-Session-Id": victim_key}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        async with client.post(f"{rig.base_url}/chat/completions", json=chat_body("Intruder."), headers=headers) as r:
            assert r.status == 200
        sessions = await _sessions(client, rig.root)
    assert sessions[victim_key] == 1
    assert len(sessions) == 2
