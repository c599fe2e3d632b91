"""The context engine wired into every API the proxy rewrites, per session (the real `ContextService`).

`prepare_turn()` takes a client's raw body and its dialect: parses it, resolves the session, runs
the pure pipeline on the conversation and the session's journal, and hands the shell an
`EngineTurn` (proxy.service.engine_turn): the body to forward and the X-Context-* headers.
Where each piece of that work runs, and in which order per session, is `proxy.service.scheduling`'s.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from proxy.config.loader import ConfigHolder
from proxy.config.settings import CapsuleSpec, Settings
from proxy.context.calibration import Calibration
from proxy.context.capsules import Capsule
from proxy.context.policy import ModelInfo, Policy
from proxy.context.recall import TOKEN_SETS
from proxy.context.steps import CutCache
from proxy.dialects import CHAT, Conversation, Dialect
from proxy.errors import ContextOverflow
from proxy.service import session_views, turn_metrics
from proxy.service.body_memos import READINGS, BodyMemos, Parsed
from proxy.service.chains import ResponseChains, UneditedTurn
from proxy.service.engine_turn import EngineTurn, TurnInputs, cache_is_cold, noted_tools_tokens
from proxy.service.memory_shares import conversation_budget, cut_budget, memo_budget, sent_budget, token_budget
from proxy.service.recent_conversations import RecentConversations
from proxy.service.scheduling import EnginePool, SessionGates
from proxy.service.sent_bodies import SentBodies
from proxy.service.session_ends import SessionEnds
from proxy.state import SessionStore, conversations, store_from_config
from proxy.state.sessions import (
    FINGERPRINT_PREFIX,
    SESSION_HEADER,
    Session,
    TurnStats,
    agent_fingerprint,
    header_value,
    scoped_key,
    session_id_for,
)
from proxy.tokens.counter import counter_for

log = logging.getLogger("proxy.service")
T = TypeVar("T")
# What one journal entry weighs in a turn's cost (`proxy.service.scheduling`): each turn copies the journal,
# about as costly per entry as parsing this many bytes of body.
JOURNAL_ENTRY_COST = 64

MAX_FALLBACK_WARNINGS = 256  # model names come from clients: warned about once each, up to this many


def _capsule(spec: CapsuleSpec) -> Capsule:
    return Capsule(id=spec.id, kind=spec.kind, text=spec.text, tags=list(spec.tags), confidence=spec.confidence)


@dataclass(frozen=True)
class _Request:
    """A request's body parsed and its session named: all a turn needs before it holds the session."""

    key: str  # the session's store key (scoped by the client's credential)
    client: str  # who asks (a hash of the credential): the engine pool's fairness is per client
    dialect: Dialect
    body: dict
    size: int  # the body's bytes
    unedited: str | None = None  # why it goes upstream as sent (the upstream holds the history)
    session_id: str = ""
    conversation: Conversation | None = None
    policy: Policy | None = None
    model: ModelInfo | None = None
    capsules: tuple[Capsule, ...] = ()
    capsule_bytes: int = 0
    agent: str = ""  # which agent the session is a run of (`agent_fingerprint`)
    notes: dict[str, Any] | None = None  # the body memo's (`Parsed.notes`): what follows from the tools
    follows: Any = None  # named by nothing: the response it continues (`previous_response_id`) names it


class EngineService:
    """Per-session context management behind the shell's `ContextService` protocol, for every dialect."""

    def __init__(self, holder: ConfigHolder, store: SessionStore) -> None:
        self.holder = holder
        self.store = store
        self.calibration = Calibration()
        self.cuts = CutCache(cut_budget(holder.settings.state))
        self.bodies = BodyMemos(memo_budget(holder.settings.state))
        self.sent = SentBodies(sent_budget(holder.settings.state))  # the last body each session sent, as bytes
        # The last conversations mapped from Messages and Responses bodies, for the next body's equal messages.
        self.conversations = RecentConversations(conversation_budget(holder.settings.state))
        # They count against the sessions' `memory_mb`.
        TOKEN_SETS.fit(token_budget(holder.settings.state))
        store.also_held = lambda: (
            self.bodies.held + self.cuts.held + self.sent.held + TOKEN_SETS.held + self.conversations.held
        )
        self.chains = ResponseChains(store)  # which session a `previous_response_id` continues
        self.pool = EnginePool()
        self.gates = SessionGates()
        self.ends = SessionEnds(holder, store)  # which sessions finished; each agent's turns to come
        self._capsule_sets: dict[int, tuple[tuple[CapsuleSpec, ...], tuple[Capsule, ...], int]] = {}
        self._fallback_warned: set[str] = set()

    @property
    def ratios(self) -> Mapping[str, float]:
        return self.calibration.ratios

    async def prepare_turn(
        self, raw: bytes, *, dialect: Dialect, path_session: str | None, headers: Mapping[str, str], credential: str
    ) -> EngineTurn | UneditedTurn:
        """The turn for a client's body, its work placed by `proxy.service.scheduling`: parsed (off the loop
        when big), then run once the session's earlier turns are done (off the loop when body, journal and
        capsules are big together). Nothing here blocks the loop: a busy session is awaited."""
        self.ends.poke()
        client = _client(credential)
        parse = functools.partial(self._parse, raw, dialect, path_session, headers, credential, client)
        request = await self.pool.run(parse, cost=len(raw), client=client)
        if request.follows is not None and (key := await self.chains.session_of(client, request.follows)):
            request = replace(request, key=key)
        async with self.gates.held(request.key):
            await self.store.restore(request.key)  # evicted for room: back from a store that keeps it
            session = self._session(request)
            cost = request.size + request.capsule_bytes + JOURNAL_ENTRY_COST * len(session.journal)
            run = functools.partial(self._run, request, session, cost)
            return await self.pool.run(run, cost=cost, client=client)

    async def _serialised(self, key: str, client: str, cost: int, work: Callable[[], T]) -> T:
        """`work` for the session `key`, after its turns before it, off the loop when `cost` is big."""
        async with self.gates.held(key):
            return await self.pool.run(work, cost=cost, client=client)

    def parse_body(
        self,
        raw: bytes,
        *,
        path_session: str | None,
        headers: Mapping[str, str],
        credential: str,
        dialect: Dialect = CHAT,
    ) -> Parsed:
        """A body, its repeated prefix taken from this conversation's last body (proxy.service.body_memos)."""
        return self._parse_remembered(raw, path_session, headers, _client(credential), dialect)

    def _parse_remembered(
        self, raw: bytes, path_session: str | None, headers: Mapping[str, str], client: str, dialect: Dialect = CHAT
    ) -> Parsed:
        self.bodies.budget = memo_budget(self.holder.settings.state)  # follows a config reload
        # One client's bodies of two APIs are memos apart: their messages' keys differ.
        scope = f"{dialect.name}\x00{_scope(client, path_session, headers)}"
        parsed = self.bodies.parse(raw, scope, READINGS[dialect.name])
        turn_metrics.HELD_MEMOS.set(self.bodies.held)
        if parsed.reused:
            turn_metrics.MESSAGES_REUSED.inc(parsed.reused)
        return parsed

    def _parse(
        self,
        raw: bytes,
        dialect: Dialect,
        path_session: str | None,
        headers: Mapping[str, str],
        credential: str,
        client: str,
    ) -> _Request:
        parsed = self._parse_remembered(raw, path_session, headers, client, dialect)
        body, digests, notes = parsed.body, parsed.digests, parsed.notes
        return self._resolve(
            dialect, body, digests, path_session, headers, credential, client, size=len(raw), notes=notes
        )

    def prepare(
        self,
        *,
        path_session: str | None,
        headers: Mapping[str, str],
        body: dict,
        credential: str,
        digests: list[bytes] | None = None,
        dialect: Dialect = CHAT,
    ) -> EngineTurn | UneditedTurn:
        """One turn, all on the calling thread (benches, tests of the engine; the shell calls `prepare_turn`)."""
        request = self._resolve(dialect, body, digests, path_session, headers, credential, _client(credential), size=0)
        return self._run(request, self._session(request), 0)

    def _session(self, request: _Request) -> Session:
        """The session keeping the request's conversation: its session's own, or one of its others
        (`proxy.state.conversations`; the caller holds the session's gate, which all its conversations share)."""
        if request.conversation is None:
            return self.store.get(request.key)
        return conversations.for_conversation(self.store, request.key, request.conversation)

    def _resolve(
        self,
        dialect: Dialect,
        body: dict,
        digests: list[bytes] | None,
        path_session: str | None,
        headers: Mapping[str, str],
        credential: str,
        client: str,
        *,
        size: int,
        notes: dict[str, Any] | None = None,
    ) -> _Request:
        """Which session the body belongs to and what it runs under; no session state is touched (`notes`: the
        body memo's, proxy.service.body_memos.Parsed: what follows from the tools is kept there)."""
        hints = dialect.session_hints(headers, body)
        if reason := dialect.unedited_reason(body):
            session_id = session_id_for(path_session, headers, hints, credential, Conversation([], []))
            key = scoped_key(session_id, credential)
            follows = body.get("previous_response_id") if session_id.startswith(FINGERPRINT_PREFIX) else None
            return _Request(key, client, dialect, body, size, unedited=reason, follows=follows)
        settings = self.holder.settings
        scope = _scope(client, path_session, headers)
        previous = self.conversations.candidates(scope) if dialect is not CHAT else ()  # chat has its body memos
        scale = self.calibration.sealed_scale(str(body.get("model") or ""))  # the name `Conversation.model` takes
        conversation = dialect.conversation(body, digests, previous, scale)
        if conversation.made_from:
            self.conversations.remember(scope, conversation)
        session_id = session_id_for(path_session, headers, hints, credential, conversation)
        policy, specs = settings.policy_for(session_id)
        model = settings.model(conversation.model)
        if model.pattern == "*":
            self._warn_fallback(conversation.model, model)
        window = dialect.requested_window(headers, body)
        if window and window > model.context_window:  # the request enables a larger one (Anthropic's 1M beta)
            model = replace(model, context_window=window)
        capsules, capsule_bytes = self._capsules(specs)
        key = scoped_key(session_id, credential)
        agent = agent_fingerprint(credential, conversation, notes)
        return _Request(
            key,
            client,
            dialect,
            body,
            size,
            None,
            session_id,
            conversation,
            policy,
            model,
            capsules,
            capsule_bytes,
            agent,
            notes,
        )

    def _capsules(self, specs: tuple[CapsuleSpec, ...]) -> tuple[tuple[Capsule, ...], int]:
        """The engine's capsules for a rule's specs, made once per config (their scoring data is kept on them)."""
        if not specs:
            return (), 0
        known = self._capsule_sets.get(id(specs))
        if known is None or known[0] is not specs:
            if len(self._capsule_sets) > 64:  # rules of configs reloaded since
                self._capsule_sets.clear()
            made = tuple(_capsule(s) for s in specs)
            known = self._capsule_sets[id(specs)] = (specs, made, sum(len(c.text) for c in made))
        return known[1], known[2]

    def _run(self, request: _Request, session: Session, cost: int) -> EngineTurn | UneditedTurn:
        """The engine on the session's journal (the caller holds the session's gate, or is alone)."""
        dialect, body = request.dialect, request.body
        if request.unedited is not None:
            return self._unedited(request, session)
        conversation, policy, model = request.conversation, request.policy, request.model
        assert conversation is not None and policy is not None and model is not None
        settings = self.holder.settings
        counter = counter_for(model.encoding)
        inputs = TurnInputs(
            dialect=dialect,
            conversation=conversation,
            policy=policy,
            model=model,
            counter=counter,
            capsules=request.capsules,
            cuts=self.cuts,
            cache_key=request.session_id if settings.responses.set_prompt_cache_key else None,
            cache_breakpoints=settings.anthropic.place_breakpoints,
            cache_cold=self.store.knows_idle and cache_is_cold(model, conversation, session.idle_s),
            lifetimes=self.ends.lifetimes(request.agent),
            tools_count=noted_tools_tokens(request.notes, conversation.tools, counter),
        )
        serialised = functools.partial(self._serialised, request.key, request.client, cost)
        with session.lock:
            session.policy = policy.name
            session.agent = request.agent
            correction = self.calibration.correction(conversation.model, session.correction, model.estimate_margin)
            outcome = inputs.run(session.journal, correction)
            if outcome.overflow:
                raise ContextOverflow(dialect.overflow_message(outcome.overflow))
            turn = EngineTurn(
                session,
                inputs,
                body,
                session.journal,
                store=self.store,
                calibration=self.calibration,
                serialised=serialised,
                sent=self.sent,
            )
            turn.stats.api = dialect.name
            turn.chain = functools.partial(self.chains.remember, request.client, key=session.id)
            retry = _is_retry(session, conversation)
            session.add_turn(turn.stats, retry=retry)
            turn.apply(outcome, correction)
        self.cuts.fit(cut_budget(settings.state))  # follows a config reload
        self.sent.fit(sent_budget(settings.state))
        TOKEN_SETS.fit(token_budget(settings.state))
        self.conversations.fit(conversation_budget(settings.state))
        turn_metrics.HELD_CONVERSATIONS.set(self.conversations.held)
        turn_metrics.HELD_CUTS.set(self.cuts.held)
        turn_metrics.HELD_SENT.set(self.sent.held)
        turn_metrics.HELD_TOKENS.set(TOKEN_SETS.held)
        if not retry:
            turn_metrics.count_turn(policy.name, outcome.report)
        return turn

    def _warn_fallback(self, name: str, model: ModelInfo) -> None:
        """Once per model name: no model-table entry but `*` matched, so its window is a guess."""
        if name in self._fallback_warned or len(self._fallback_warned) >= MAX_FALLBACK_WARNINGS:
            return
        self._fallback_warned.add(name)
        table = self.holder.settings.models
        entry = 'but "*"' if any(m.pattern == "*" for m in table) else '(and the table has no "*")'
        log.warning(
            "model %r matches no [models] entry %s: assuming a %d-token window; add an entry to say otherwise",
            name[:100],
            entry,
            model.context_window,
        )

    def _unedited(self, request: _Request, session: Session) -> UneditedTurn:
        """A turn whose history the upstream holds: shown in /sessions as forwarded unedited, with its usage."""
        body, reason = request.body, str(request.unedited)
        stats = TurnStats(model=str(body.get("model") or ""), api=request.dialect.name, unedited=reason)
        with session.lock:
            session.add_turn(stats)
            self.store.save(session)
        model = self.holder.settings.model(stats.model)
        chain = functools.partial(self.chains.remember, request.client, key=session.id)
        headers = {"X-Context-Unedited": reason}
        return UneditedTurn(body, session, stats, request.dialect, model, self.store, chain, self.calibration, headers)

    def close(self) -> None:
        """Write out what the session store has queued (at shutdown); the engine threads stop."""
        self.pool.close()
        self.store.close()

    def state_problem(self) -> str | None:
        """Why the session store is degraded (`/healthz` "state"), or None."""
        return self.store.problem

    async def sessions_json(self) -> list[dict[str, Any]]:
        return await session_views.rows(self.store)

    async def session_json(self, session_id: str) -> dict[str, Any] | None:
        return await session_views.detail(self.store, self.ends, session_id)


def _is_retry(session: Session, conversation: Conversation) -> bool:
    """The client sent its last request again after an answer without usage (an upstream error it retries, such
    as Anthropic's 529 overloaded): the same turn, not a new one. Remembers this request for the next."""
    request = hashlib.sha256(b"".join(conversation.digests) + conversation.model.encode()).digest()[:16]
    last = session.turns[-1] if session.turns else None
    retry = last is not None and last.prompt_tokens is None and not last.unedited and session.last_request == request
    session.last_request = request
    return retry


def _scope(client: str, path_session: str | None, headers: Mapping[str, str]) -> str:
    """Whose conversations a body may continue: the client's, under the session name it gives (path or header)."""
    return f"{client}\x00{path_session or ''}\x00{header_value(headers, SESSION_HEADER) or ''}"


def _client(credential: str) -> str:
    """Who asks, without keeping their key in memory: the body memos' scope and the engine pool's fairness."""
    return hashlib.sha256(credential.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def load_tokenizers(settings: Settings) -> list[str]:
    """Load every encoding the model table (and its default) counts with; the names, in order.

    Loading one takes a second of CPU or so (o200k_base ~0.7-1.1 s): done at start, no request waits on it.
    """
    names = sorted({model.encoding for model in settings.models} | {settings.default_encoding})
    for name in names:
        counter_for(name).count_text("warm")  # the encoding's tables, and tiktoken's first encode
    return names


def build_context_service(holder: ConfigHolder) -> EngineService:
    """The service a server runs by default: sessions bounded and stored as `[state]` says, and the
    configured models' tokenizers loaded, so the first request costs what any other does."""
    load_tokenizers(holder.settings)
    return EngineService(holder, store_from_config(holder.settings.state))
