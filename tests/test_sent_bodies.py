"""A warm turn's body bytes made from the last body's (proxy/service/sent_bodies.py) are `orjson.dumps` of its body."""

from __future__ import annotations

from dataclasses import replace

import orjson

from proxy.config.loader import ConfigHolder, load_settings
from proxy.service.engine_service import build_context_service
from proxy.service.sent_bodies import SentBodies
from tests.context.test_edited_contents import _steps


def _service(**state: float) -> object:
    settings = load_settings()
    settings = replace(settings, path="", state=replace(settings.state, **state))
    return build_context_service(ConfigHolder(settings))


def test_every_streamed_turn_of_an_edited_session_sends_the_bytes_of_its_body() -> None:
    """Streamed without the client asking for usage: the proxy adds stream options to every body it sends."""
    service = _service()
    messages = _steps(60)
    made = 0
    for n in range(3, len(messages) + 1, 2):
        raw = orjson.dumps({"model": "gpt-4o", "messages": messages[:n], "stream": True, "temperature": 0})
        parsed = service.parse_body(raw, path_session="s", headers={}, credential="sk")
        turn = service.prepare(path_session="s", headers={}, body=parsed.body, credential="sk", digests=parsed.digests)
        assert turn.data == orjson.dumps(turn.body), f"{n} messages"
        made += turn.data is not None
        report = turn.outcome.report
        turn.record_usage([{"usage": {"prompt_tokens": report.tokens_after, "prompt_tokens_details": {}}}])

    assert made > 20
    assert len(service.sent) == 1 and service.sent.held > 2 * len(turn.data)  # its bytes, and what they keep alive


def test_the_sent_bodies_stay_within_their_budget_the_oldest_going_first() -> None:
    sent = SentBodies(budget_bytes=10_000)
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 1000}]}
    for key in "abcd":
        assert sent.serialise(key, body, body, [0]) == orjson.dumps(body)

    assert sent.held <= 10_000
    assert len(sent) == 3  # "a" went first
    sent.fit(0)
    assert (len(sent), sent.held) == (0, 0)
