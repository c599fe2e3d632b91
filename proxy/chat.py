"""The context engine wired into `/v1/chat/completions`, per session (the real `ContextService`).

`prepare()` resolves the session, runs the pure pipeline on its journal and hands the
shell a `ChatTurn`: the body to forward and the X-Context-* headers. The turn learns
from the upstream's `usage` (billed and cached tokens, our estimate's error per model)
and re-fits once when the upstream still says the context is too long.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.bodies import BodyMemos, Parsed
from proxy.config import CapsuleSpec, ConfigHolder
from proxy.context.capsules import Capsule
from proxy.context.messages import message_digest
from proxy.context.pipeline import Outcome, process
from proxy.context.policy import ModelInfo, Policy
from proxy.metrics import METRICS
from proxy.sessions import (
    SESSION_HEADER,
    Session,
    TurnStats,
    cost_usd,
    header_value,
    scoped_key,
    session_id_for,
    visible_id,
)
from proxy.state import SessionStore
from proxy.tokens import TokenCounter, counter_for
from proxy.turns import Rejected

# The learned ratio of upstream prompt tokens to our estimate: smoothed, bounded, per model name.
RATIO_SMOOTHING = 0.3
RATIO_BOUNDS = (0.8, 1.5)
RATIO_MIN_ESTIMATE = 256  # below this, fixed overheads dominate and the ratio says little
MAX_MODELS_LEARNED = 256
# A refit aims this much under what the upstream reported, so the retry does not miss by a hair.
REFIT_MARGIN = 1.02
REFIT_MAX_CORRECTION = 2.0

_POLICY = ("policy",)
TOKENS_BEFORE = METRICS.counter("context_tokens_before_total", "Prompt tokens the clients sent (estimated)", _POLICY)
TOKENS_AFTER = METRICS.counter("context_tokens_after_total", "Prompt tokens forwarded upstream (estimated)", _POLICY)
TOKENS_SAVED = METRICS.counter("context_tokens_saved_total", "Prompt tokens the engine removed (estimated)", _POLICY)
CACHED_TOKENS = METRICS.counter("context_upstream_cached_tokens_total", "Cached prompt tokens billed", _POLICY)
PROMPT_TOKENS = METRICS.counter("context_upstream_prompt_tokens_total", "Prompt tokens billed upstream", _POLICY)
EPOCHS = METRICS.counter("context_epochs_total", "Turns whose edit epoch changed the forwarded prefix", _POLICY)
MESSAGES_REUSED = METRICS.counter(
    "context_messages_reused_total", "Messages taken from the session's last body instead of parsed again"
)
RETRIES = METRICS.counter("context_refits_total", "Requests re-fitted after context_length_exceeded", _POLICY)
COST = METRICS.counter("context_estimated_cost_usd_total", "Input cost, proxied or direct", ("policy", "route"))
SAVED = METRICS.gauge("context_estimated_saved_usd", "Direct minus proxied input cost (negative when worse)", _POLICY)


def _capsule(spec: CapsuleSpec) -> Capsule:
    return Capsule(id=spec.id, kind=spec.kind, text=spec.text, tags=list(spec.tags), confidence=spec.confidence)


def _count(value: Any) -> int | None:
    """A token count from a JSON body: a whole number >= 0 (JSON's true/false are not counts)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _max_output_tokens(body: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        if value := _count(body.get(key)):
            return value
    return None


def _usage_numbers(usage: Mapping[str, Any]) -> tuple[int, int] | None:
    prompt = _count(usage.get("prompt_tokens"))
    if prompt is None:
        return None
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return prompt, cached or 0


@dataclass(frozen=True)
class _Inputs:
    """Everything `process()` takes besides the journal and the correction, fixed for the turn."""

    messages: list[dict[str, Any]]
    digests: list[bytes]  # each message's `message_digest`, computed once for the session id and the engine
    tools: Any
    policy: Policy
    model_name: str
    model: ModelInfo
    counter: TokenCounter
    capsules: tuple[Capsule, ...]
    max_output_tokens: int | None

    def run(self, journal: Any, correction: float) -> Outcome:
        return process(
            journal,
            self.messages,
            tools=self.tools,
            policy=self.policy,
            model=self.model,
            counter=self.counter,
            capsules=self.capsules,
            max_output_tokens=self.max_output_tokens,
            correction=correction,
            digests=self.digests,
        )


class ChatTurn:
    """One prepared request (`proxy.turns.PreparedTurn`): the body to send and what to learn from the answer."""

    def __init__(
        self, service: ContextService, session: Session, inputs: _Inputs, body: dict, journal_before: Any
    ) -> None:
        self.service = service
        self.session = session
        self.inputs = inputs
        self.client_body = body
        self.journal_before = journal_before
        self.body: dict = {}
        self.headers: dict[str, str] = {}
        self.strip_usage_chunk = False
        self.unchanged = False
        self.stats = TurnStats()
        self.outcome: Outcome | None = None
        self.correction = 1.0

    @property
    def estimate(self) -> float:
        """Our uncorrected count of what was sent (the report's count carries the correction)."""
        return self.outcome.report.tokens_after / self.correction if self.outcome and self.correction > 0 else 0.0

    def apply(self, outcome: Outcome, correction: float, *, retried: bool = False) -> None:
        """Adopt an outcome: the session's journal, the body, headers and this turn's report."""
        self.outcome, self.correction = outcome, correction
        self.session.journal = outcome.journal
        self.body = {**self.client_body, "messages": outcome.messages}
        sent = self.client_body["messages"]
        self.unchanged = len(outcome.messages) == len(sent) and all(
            a is b for a, b in zip(outcome.messages, sent, strict=True)
        )
        if self.client_body.get("stream") is True:
            options = self.client_body.get("stream_options")
            options = options if isinstance(options, dict) else {}
            if options.get("include_usage") is not True:
                self.body["stream_options"] = {**options, "include_usage": True}
                self.strip_usage_chunk = True
                self.unchanged = False
        self.headers = dict(outcome.report.headers())
        self.stats.report = outcome.report
        self.stats.model = self.inputs.model_name
        self.stats.retried = retried
        self.service.store.save(self.session)

    def record_usage(self, usage: dict) -> None:
        numbers = _usage_numbers(usage) if isinstance(usage, dict) else None
        if numbers is None or self.outcome is None or self.stats.prompt_tokens is not None:
            return
        prompt, cached = numbers
        report = self.outcome.report
        self.service.learn_ratio(self.inputs.model_name, prompt, self.estimate)
        # The unedited request, scaled by the same upstream/estimate ratio; its cache would have held
        # the previous turn's unedited prompt (a client that only appends never breaks its own prefix).
        scale = prompt / report.tokens_after if report.tokens_after else 1.0
        direct_prompt = round(report.tokens_before * scale)
        caching = self.inputs.model.cache_discount < 1
        direct_cached = min(self.session.direct_prompt_tokens, direct_prompt) if caching else 0
        self.session.direct_prompt_tokens = direct_prompt
        stats = self.stats
        stats.prompt_tokens, stats.cached_tokens = prompt, cached
        stats.cost_usd = cost_usd(self.inputs.model, prompt, cached)
        stats.direct_cost_usd = cost_usd(self.inputs.model, direct_prompt, direct_cached)
        self.session.cost_usd += stats.cost_usd
        self.session.direct_cost_usd += stats.direct_cost_usd
        policy = self.session.policy
        PROMPT_TOKENS.inc(prompt, policy=policy)
        CACHED_TOKENS.inc(cached, policy=policy)
        COST.inc(stats.cost_usd, policy=policy, route="proxied")
        COST.inc(stats.direct_cost_usd, policy=policy, route="direct")
        SAVED.inc(stats.direct_cost_usd - stats.cost_usd, policy=policy)
        self.service.store.save(self.session)

    def refit(self, reported_prompt_tokens: int) -> dict | None:
        """Re-run the turn from the journal as it was before it, with our count scaled to the upstream's."""
        if self.outcome is None or self.stats.retried or reported_prompt_tokens <= 0 or self.estimate <= 0:
            return None
        learned = min(REFIT_MAX_CORRECTION, reported_prompt_tokens / self.estimate * REFIT_MARGIN)
        self.session.correction = max(self.session.correction, learned)
        RETRIES.inc(policy=self.session.policy)
        correction = self.service.correction_for(self.session, self.inputs)
        with self.session.lock:
            outcome = self.inputs.run(self.journal_before, correction)
            self.stats.retried = True
            if outcome.rejected or outcome.messages == self.outcome.messages:
                return None
            self.apply(outcome, correction, retried=True)
        return self.body


class ContextService:
    """Per-session context management behind the shell's `ContextService` protocol."""

    def __init__(self, holder: ConfigHolder, store: SessionStore) -> None:
        self.holder = holder
        self.store = store
        self.ratios: OrderedDict[str, float] = OrderedDict()  # model name -> upstream/estimate
        self.bodies = BodyMemos(holder.settings.state.body_memo_bytes)

    def parse_body(
        self, raw: bytes, *, path_session: str | None, headers: Mapping[str, str], credential: str
    ) -> Parsed:
        """The validated body, its repeated prefix taken from this conversation's last body (proxy.bodies)."""
        self.bodies.budget = self.holder.settings.state.body_memo_bytes  # follows a config reload
        client = hashlib.sha256(credential.encode("utf-8", "surrogatepass")).hexdigest()[:32]  # no key kept in memory
        scope = f"{client}\x00{path_session or ''}\x00{header_value(headers, SESSION_HEADER) or ''}"
        parsed = self.bodies.parse(raw, scope)
        if parsed.reused:
            MESSAGES_REUSED.inc(parsed.reused)
        return parsed

    def prepare(
        self,
        *,
        path_session: str | None,
        headers: Mapping[str, str],
        body: dict,
        credential: str,
        digests: list[bytes] | None = None,
    ) -> ChatTurn:
        settings = self.holder.settings
        if digests is None or len(digests) != len(body["messages"]):
            digests = [message_digest(m) for m in body["messages"]]
        session_id = session_id_for(path_session, headers, body, credential, digests)
        policy, specs = settings.policy_for(session_id)
        model_name = str(body.get("model") or "")
        model = settings.model(model_name)
        inputs = _Inputs(
            messages=body["messages"],
            digests=digests,
            tools=body.get("tools"),
            policy=policy,
            model_name=model_name,
            model=model,
            counter=counter_for(model.encoding),
            capsules=tuple(_capsule(s) for s in specs),
            max_output_tokens=_max_output_tokens(body),
        )
        session = self.store.get(scoped_key(session_id, credential))
        with session.lock:
            session.policy = policy.name
            correction = self.correction_for(session, inputs)
            outcome = inputs.run(session.journal, correction)
            if outcome.rejected:
                raise Rejected(400, outcome.rejected, "context_length_exceeded")
            turn = ChatTurn(self, session, inputs, body, journal_before=session.journal)
            session.add_turn(turn.stats)
            turn.apply(outcome, correction)
        self._count(policy.name, outcome)
        return turn

    def correction_for(self, session: Session, inputs: _Inputs) -> float:
        """The model's learned ratio, never below what a retry taught this session."""
        return max(self.ratios.get(inputs.model_name, 1.0), session.correction)

    def learn_ratio(self, model_name: str, prompt_tokens: int, estimate: float) -> None:
        if estimate < RATIO_MIN_ESTIMATE:
            return
        observed = min(RATIO_BOUNDS[1], max(RATIO_BOUNDS[0], prompt_tokens / estimate))
        old = self.ratios.pop(model_name, observed)
        self.ratios[model_name] = old + RATIO_SMOOTHING * (observed - old)
        while len(self.ratios) > MAX_MODELS_LEARNED:
            self.ratios.popitem(last=False)

    def sessions_json(self) -> list[dict[str, Any]]:
        """`GET /sessions`: one row per session in memory, most recent first; no message text."""
        return sorted((s.summary() for s in self.store), key=lambda row: row["last_seen"], reverse=True)

    def session_json(self, session_id: str) -> dict[str, Any] | None:
        """`GET /sessions/{id}`: per turn, what the engine did and what the upstream billed."""
        session = self.store.peek(session_id)
        if session is None:  # the id as the client named it: the most recent client's session of that name
            named = [s for s in self.store if visible_id(s.id) == session_id]
            session = max(named, key=lambda s: s.last_seen, default=None)
        return session.to_dict() if session is not None else None

    def _count(self, policy: str, outcome: Outcome) -> None:
        report = outcome.report
        TOKENS_BEFORE.inc(report.tokens_before, policy=policy)
        TOKENS_AFTER.inc(report.tokens_after, policy=policy)
        TOKENS_SAVED.inc(max(0, report.tokens_before - report.tokens_after), policy=policy)
        if report.epoch:
            EPOCHS.inc(policy=policy)


def build_context_service(holder: ConfigHolder) -> ContextService:
    """The service a server runs by default: sessions bounded and stored as `[state]` says."""
    return ContextService(holder, SessionStore.from_config(holder.settings.state))
