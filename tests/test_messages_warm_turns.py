"""A Messages body's messages equal to the last body's take the engine messages mapped from them then
(`proxy.service.recent_conversations`): through a real server, every turn must send upstream the bytes a
reference engine sends that maps every message of every body anew.

Each packaged trace is posted turn by turn as Claude Code sends it (its breakpoints on the system prompt and the
last message, moved every turn) and as a client that marks none, to a proxy in front of the simulator, on a 32k
Claude: clearing, compaction and truncation all happen. Beside it, in this process, an engine service on the same
config runs the same bodies with no conversation to continue.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from proxy.config.loader import ConfigHolder
from proxy.demo.traces import list_traces, load_trace
from proxy.demo.traces_messages import BREAKPOINT_STYLES, messages_requests
from proxy.dialects import MESSAGES
from proxy.service.engine_service import build_context_service
from tests.test_messages_http import messages_rig

__all__ = ["messages_rig"]  # the fixture this module uses

MODEL = "claude-sim-32k"
HEADERS = {"x-api-key": "sk-ant-warm", "anthropic-version": "2023-06-01", "Content-Type": "application/json"}


def _rewritten(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The last body again with an early user message rewritten in place (its tool results' or its text), then
    without it and the call before it: the client edited its history, so messages at the same place are no longer
    the ones last mapped there."""
    messages = body["messages"]
    at = next(i for i, m in enumerate(messages) if i > 1 and m["role"] == "user")

    def rewritten(block: dict[str, Any]) -> dict[str, Any]:
        key = "content" if block.get("type") == "tool_result" else "text" if block.get("type") == "text" else None
        return {**block, key: "rewritten by the client"} if key else block

    edited = [*messages[:at], {**messages[at], "content": [rewritten(b) for b in messages[at]["content"]]}]
    edited += messages[at + 1 :]
    return [{**body, "messages": edited}, {**body, "messages": [*edited[: at - 1], *edited[at + 1 :]]}]


@pytest.mark.parametrize("style", BREAKPOINT_STYLES)
@pytest.mark.parametrize("name", list_traces())
async def test_every_messages_turn_sends_what_mapping_every_message_anew_sends(
    messages_rig: Any, monkeypatch: pytest.MonkeyPatch, name: str, style: str
) -> None:
    rig = await messages_rig()
    reference = build_context_service(ConfigHolder(rig.context.holder.settings))
    monkeypatch.setattr(reference.conversations, "candidates", lambda scope: [])  # every body mapped anew
    session, edited = f"warm-{style}", 0
    bodies = list(messages_requests(load_trace(name), MODEL, style))
    async with aiohttp.ClientSession() as http:
        for k, body in enumerate([*bodies, *_rewritten(bodies[-1])]):
            raw = orjson.dumps(body)
            url = f"http://127.0.0.1:{rig.port}/s/{session}/v1/messages"
            async with http.post(url, data=raw, headers=HEADERS) as response:
                assert response.status == 200, await response.text()
                answer, headers = await response.json(), response.headers
            turn = reference.prepare(
                path_session=session, headers={}, body=orjson.loads(raw), credential="sk", dialect=MESSAGES
            )
            expected = raw if turn.unchanged else orjson.dumps(turn.body)

            assert rig.sim.requests[-1].raw == expected, f"turn {k + 1}: sent otherwise than mapped anew"
            for header, value in turn.headers.items():
                assert headers[header] == value, f"turn {k + 1}: {header}"
            turn.record_usage([answer])
            edited += not turn.unchanged
    assert rig.context.conversations.held > 0  # the proxy kept the conversations it continued
    if not name.startswith("sweagent_text"):  # (its text mode needs its session rule's observation pattern)
        assert edited > 0
