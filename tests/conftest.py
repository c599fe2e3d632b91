"""Fixtures for the HTTP shell: the simulator and a proxy in front of it (tests/harness.py), all on 127.0.0.1.

`make_rig(...)` starts a `Rig` and stops it after the test; `rig` is one with the pass-through
shell and the recorded OpenAI streams of tests/data/sse loaded (replayed by `X-Sim-Recorded`).
`RecordingService` stands in for the ContextService seam, so the shell is tested alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from proxy.demo.simulator import SimulatorConfig
from tests.harness import Rig, start_rig
from tests.redis_server import RedisServer

SSE_DIR = Path(__file__).parent / "data" / "sse"
RECORDED_STREAMS = {path.name: path.read_bytes() for path in sorted(SSE_DIR.glob("*.sse"))}

MakeRig = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def make_rig() -> AsyncIterator[MakeRig]:
    """`await make_rig(sim_config=..., context=..., server={...}, upstream={...})`: see harness.start_rig."""
    rigs: list[Rig] = []

    async def make(**kwargs: Any) -> Rig:
        kwargs.setdefault("sim_config", SimulatorConfig(recorded_streams=RECORDED_STREAMS))
        rig = await start_rig(**kwargs)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        await rig.close()


@pytest.fixture
async def rig(make_rig: MakeRig) -> Rig:
    return await make_rig()


@dataclass
class RecordingTurn:
    """A PreparedTurn that keeps what the shell told it."""

    body: dict
    headers: dict[str, str]
    strip_usage_chunk: bool = False
    unchanged: bool = False  # the shell re-serialises `body`, so a test sees what the service returned
    data: bytes | None = None
    commits: bool = False
    usages: list[dict] = field(default_factory=list)
    refits: list[int] = field(default_factory=list)
    refit_body: dict | None = None

    def record_usage(self, payloads: list[dict]) -> None:
        self.usages.extend(p["usage"] for p in payloads if isinstance(p.get("usage"), dict))

    async def refit(self, reported_prompt_tokens: int) -> dict | None:
        self.refits.append(reported_prompt_tokens)
        return self.refit_body

    async def commit(self) -> None:
        return None


@dataclass
class RecordingService:
    """A ContextService for tests: adds headers, may strip usage, refit (to the last message), reject or crash."""

    strip_usage_chunk: bool = False
    refit: bool = True
    fail_with: Exception | None = None
    turns: list[RecordingTurn] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)

    async def prepare_turn(self, raw, *, dialect, path_session, headers, credential) -> RecordingTurn:
        body = dialect.parse(raw)
        self.calls.append(
            {
                "path_session": path_session,
                "credential": credential,
                "body": body,
            }
        )
        if self.fail_with is not None:
            raise self.fail_with
        if self.strip_usage_chunk and body.get("stream"):
            body = {**body, "stream_options": {"include_usage": True}}
        refit_body = {**body, "messages": body["messages"][-1:]} if self.refit else None
        turn = RecordingTurn(
            body,
            {"X-Context-Tokens-Before": "100", "X-Context-Tokens-After": "60"},
            self.strip_usage_chunk,
            refit_body=refit_body,
        )
        self.turns.append(turn)
        return turn

    async def sessions_json(self) -> list[dict]:
        return [{"id": c["path_session"]} for c in self.calls]

    async def session_json(self, session_id: str) -> dict | None:
        return {"id": session_id} if any(c["path_session"] == session_id for c in self.calls) else None

    def state_problem(self) -> None:
        return None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server (Debian's) on a free port, for this test alone."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
