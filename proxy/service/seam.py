"""The seam between the HTTP shell and the context engine (docs/architecture.md).

The shell only knows these Protocols; `proxy.service.engine_service` implements them for real and
`PassthroughService` forwards every body unchanged, so the shell runs and is tested alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from proxy.dialects import Dialect


class PreparedTurn(Protocol):
    body: dict  # what goes upstream (messages rewritten, maybe stream_options added)
    headers: dict[str, str]  # X-Context-* headers for the client's response
    strip_usage_chunk: bool  # we asked upstream for include_usage; drop that chunk before the client
    unchanged: bool  # `body` is exactly the client's body: its own bytes are forwarded, not re-serialised
    data: bytes | None  # `body`'s bytes when the service made them (from the last body's); None: serialise `body`

    @property
    def commits(self) -> bool: ...  # `commit` writes somewhere (a shared session store); False: it is not called

    # The JSON response body, or every SSE event payload that held a usage object (the dialect reads them).
    def record_usage(self, payloads: Sequence[Mapping[str, Any]]) -> None: ...

    # The upstream said context_length_exceeded: a re-fitted body (None: send nothing more). Awaited: a big
    # turn's refit runs on an engine thread, after the session's other turns.
    async def refit(self, reported_prompt_tokens: int) -> dict | None: ...

    # Write the turn to the session store: awaited before the body is sent (a shared store may re-run
    # the turn on a newer journal, changing `body`) and again after the answer (its usage).
    async def commit(self) -> None: ...


@runtime_checkable
class ContextService(Protocol):
    # The turn for a client's body: parsed by `dialect` (raises proxy.errors.ProxyError to answer locally,
    # e.g. InvalidRequest, ContextOverflow). Awaited: the service decides where its work runs, and never
    # blocks the loop while it does (proxy.service.scheduling).
    async def prepare_turn(
        self, raw: bytes, *, dialect: Dialect, path_session: str | None, headers: Mapping[str, str], credential: str
    ) -> PreparedTurn: ...

    # GET /sessions (every instance's, with a shared store); None: this service keeps none.
    async def sessions_json(self) -> list[dict[str, Any]] | None: ...

    async def session_json(self, session_id: str) -> dict[str, Any] | None: ...  # GET /sessions/{id}; None: not found

    def state_problem(self) -> str | None: ...  # why the session store is degraded (/healthz "state"); None: ok


@dataclass
class PassthroughTurn:
    """A turn forwarded exactly as the client sent it."""

    body: dict
    headers: dict[str, str] = field(default_factory=dict)
    strip_usage_chunk: bool = False
    payloads: Sequence[Mapping[str, Any]] = ()
    unchanged: bool = True
    data: bytes | None = None
    commits: bool = False

    def record_usage(self, payloads: Sequence[Mapping[str, Any]]) -> None:
        self.payloads = payloads

    async def refit(self, reported_prompt_tokens: int) -> dict | None:
        return None

    async def commit(self) -> None:
        return None


class PassthroughService:
    """The shell's default engine: body unchanged, no headers, no stripping."""

    async def prepare_turn(
        self, raw: bytes, *, dialect: Dialect, path_session: str | None, headers: Mapping[str, str], credential: str
    ) -> PassthroughTurn:
        return PassthroughTurn(body=dialect.parse(raw))

    async def sessions_json(self) -> None:
        return None

    async def session_json(self, session_id: str) -> None:
        return None

    def state_problem(self) -> None:
        return None
