"""Warm turns through a real server send upstream, byte for byte, what the full pipeline sends for the same turn.

A warm turn takes what it can from the last one (the body memo's parsed prefix, the edited messages' contents
kept by the journal, the index of where earlier outputs' lines stand). Each packaged trace is posted turn by turn
to a real proxy in front of the simulator (a 32k window: clearing, compaction, dedup and truncation all happen);
beside it, in this process, an engine service on the same config runs the same turns the long way: every body
parsed whole, every edited message emitted anew by its step (`_emit_anew`), every earlier output indexed again for
compacting the newest (`_places_anew`). Each turn the bytes the simulator received must be that engine's body,
its X-Context-* headers the same, and at the end the session's figures too; the reference learns the usage the
simulator billed, from the answer the client got.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

from proxy.config.loader import ConfigHolder, load_settings
from proxy.context.draft import Draft
from proxy.context.steps.compact import Compaction
from proxy.demo.simulator import SIMULATOR, start_simulator
from proxy.demo.traces import list_traces, load_trace, requests
from proxy.service.engine_service import EngineService, build_context_service
from proxy.shell.server import start
from tests.context.test_edited_contents import _emit_anew, _places_anew
from tests.test_traces_http import CONFIG, MODEL

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEY = "sk-warm"
TIMING = ("last_seen", "idle_s")  # the clock's, not the engine's


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[str, Any, EngineService]]:
    """The simulator, a proxy in front of it, and the reference engine on the proxy's config (one each for the
    module: the model's learned token ratio is the service's, so both see the traces in the same order)."""
    sim_runner, sim_url = await start_simulator()
    folder = tmp_path_factory.mktemp("warm")
    (folder / "proxy.toml").write_text(CONFIG.format(url=sim_url))
    holder = ConfigHolder(load_settings(folder / "proxy.toml"))
    runner, port = await start(holder, "127.0.0.1", 0, context=build_context_service(holder))
    yield f"http://127.0.0.1:{port}", sim_runner.app[SIMULATOR], build_context_service(holder)
    await runner.cleanup()
    await sim_runner.cleanup()


def _reference_turn(reference: EngineService, raw: bytes, session: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The turn the long way: the body parsed whole, every edited message emitted by its step, every earlier output
    indexed again."""
    body = orjson.loads(raw)
    with monkeypatch.context() as patch:
        patch.setattr(Draft, "emitted", _emit_anew)
        patch.setattr(Compaction, "_standing_before", _places_anew)
        return reference.prepare(path_session=session, headers={}, body=body, credential=KEY)


def _figures(report: Any) -> Any:
    """A `/sessions/{id}` body without what the clock says (its conversations' rows too)."""
    if isinstance(report, list):
        return [_figures(item) for item in report]
    if isinstance(report, dict):
        return {k: _figures(v) for k, v in report.items() if k not in TIMING}
    return report


@pytest.mark.parametrize("name", list_traces())
async def test_every_warm_turn_sends_upstream_the_bytes_the_full_pipeline_sends(
    servers: tuple[str, Any, EngineService], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    root, sim, reference = servers
    trace, session = load_trace(name), f"warm-{name}"
    extra = {"tools": trace.tools} if trace.tools else {}
    edited = epochs = 0
    async with aiohttp.ClientSession() as http:
        for k, (messages, _answer) in enumerate(requests(trace)):
            raw = orjson.dumps({"model": MODEL, "messages": messages, **extra})
            url = f"{root}/s/{session}/v1/chat/completions"
            async with http.post(url, data=raw, headers={"Authorization": f"Bearer {KEY}"}) as response:
                assert response.status == 200, await response.text()
                answer, headers = await response.json(), response.headers
            turn = _reference_turn(reference, raw, session, monkeypatch)
            expected = raw if turn.unchanged else orjson.dumps(turn.body)

            assert sim.requests[-1].raw == expected, f"turn {k + 1}: sent otherwise than the full pipeline"
            for header, value in turn.headers.items():
                assert headers[header] == value, f"turn {k + 1}: {header}"
            turn.record_usage([answer])
            edited += not turn.unchanged
            epochs += turn.headers["X-Context-Epoch"] == "1"
        async with http.get(f"{root}/sessions/{session}") as response:
            served = await response.json()
    expected_report = await reference.session_json(session)
    assert expected_report is not None
    assert _figures(served) == _figures(expected_report)
    if not name.startswith("sweagent_text"):  # (SWE-agent's text mode needs its session rule's observation pattern)
        assert edited > 0 and epochs > 0  # edits were made, and kept from turn to turn
