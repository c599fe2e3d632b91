"""The proxy keeps no cookies of its own: what an upstream sets goes to the client that asked, never along with
another client's request (a shared cookie jar in the proxy's one upstream client would send one user's cookies
for everyone: Cloudflare's `__cf_bm` and `_cfuvid`, which OpenAI's and Anthropic's APIs set, among them)."""

from __future__ import annotations

import anthropic
import openai
from aiohttp import web

from tests.harness import ChatUpstream, start_rig


class CookieUpstream(ChatUpstream):
    """Sets a cookie named after the caller's key on every answer; records the Cookie header of each request."""

    def __init__(self) -> None:
        super().__init__(paths=("/v1/chat/completions", "/v1/models", "/v1/messages"))
        self.app.router.add_get("/v1/models", self.answer)
        self.cookies: list[tuple[str, str | None]] = []  # each request's key, and the Cookie header it came with

    async def answer(self, request: web.Request) -> web.StreamResponse:
        key = (request.headers.get("Authorization") or request.headers.get("x-api-key") or "").rsplit(" ", 1)[-1]
        self.cookies.append((key, request.headers.get("Cookie")))
        if request.path == "/v1/models":
            response = web.json_response({"object": "list", "data": []})
        elif request.path == "/v1/messages":
            response = web.json_response(
                {
                    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                    "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn", "stop_sequence": None,
                    "usage": {"input_tokens": 5, "output_tokens": 1},
                }
            )  # fmt: skip
        else:
            response = web.json_response(
                {
                    "id": "c1", "object": "chat.completion", "created": 0, "model": "gpt-4o",
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                }
            )  # fmt: skip
        response.set_cookie("__cf_bm", f"for-{key}", path="/", httponly=True)
        return response


async def test_an_upstream_cookie_set_for_one_client_never_goes_with_anothers_request():
    upstream = CookieUpstream()
    # By name, as api.openai.com is: aiohttp's cookie jar keeps no cookie an IP address set (still 127.0.0.1).
    url = (await upstream.start()).replace("127.0.0.1", "localhost")
    rig = await start_rig(upstream_url=url, engine=True)
    try:
        alice = openai.AsyncOpenAI(base_url=rig.base_url, api_key="sk-alice", max_retries=0, timeout=10)
        bob = openai.AsyncOpenAI(base_url=rig.base_url, api_key="sk-bob", max_retries=0, timeout=10)
        carol = anthropic.AsyncAnthropic(base_url=rig.root, api_key="sk-carol", max_retries=0, timeout=10)
        said = [{"role": "user", "content": "Say hello."}]
        raw = await alice.chat.completions.with_raw_response.create(model="gpt-4o", messages=said)
        assert "for-sk-alice" in raw.headers.get("set-cookie", "")  # the client that asked gets it
        await bob.chat.completions.create(model="gpt-4o", messages=said)
        await bob.models.list()  # a passthrough route too
        await carol.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=said)
        await alice.chat.completions.create(model="gpt-4o", messages=said)
        # Each SDK keeps the cookies it was given (httpx's jar) and sends them back: its own, never another's.
        assert upstream.cookies == [
            ("sk-alice", None),
            ("sk-bob", None),
            ("sk-bob", "__cf_bm=for-sk-bob"),
            ("sk-carol", None),
            ("sk-alice", "__cf_bm=for-sk-alice"),
        ]
    finally:
        await rig.close()
        await upstream.runner.cleanup()
