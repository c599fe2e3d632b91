"""One prepared turn: the body to send upstream, and what the upstream's answer teaches.

`EngineTurn` is what `EngineService.prepare_turn` hands the shell (`proxy.service.seam.PreparedTurn`):
it adopts the engine's outcome into the session, learns billed and cached tokens from the usage, and
re-runs the engine once (`refit`) when the upstream still says the context is too long, or (`realign`)
when another process wrote the session first; both after the session's other turns, off the loop when big.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from proxy.context.calibration import Calibration, refit_correction
from proxy.context.capsules import Capsule
from proxy.context.journal import Journal, TurnReport
from proxy.context.pipeline import Outcome, process, tools_tokens
from proxy.context.policy import ModelInfo, Policy
from proxy.context.steps import CutCache
from proxy.context.survival import NO_HISTORY, Lifetimes
from proxy.dialects import CHAT, Conversation, Dialect, Usage
from proxy.dialects.base import sealed_parts, writes_at
from proxy.errors import ContextOverflow
from proxy.metrics import METRICS, Series
from proxy.service.sent_bodies import SentBodies
from proxy.state import SessionStore
from proxy.state.sessions import Session, TurnStats, savings, visible_id
from proxy.tokens.counter import TokenCounter

log = logging.getLogger("proxy.service")

_POLICY = ("policy",)
T = TypeVar("T")
CACHED_TOKENS = METRICS.counter("context_proxy_upstream_cached_tokens_total", "Cached prompt tokens billed", _POLICY)
PROMPT_TOKENS = METRICS.counter("context_proxy_upstream_prompt_tokens_total", "Prompt tokens billed upstream", _POLICY)
RETRIES = METRICS.counter("context_proxy_refits_total", "Requests re-fitted after context_length_exceeded", _POLICY)
COST = METRICS.counter("context_proxy_estimated_cost_usd_total", "Input cost, proxied or direct", ("policy", "route"))
SAVED = METRICS.gauge(
    "context_proxy_estimated_saved_usd", "Direct minus proxied input cost (negative when worse)", _POLICY, live=False
)


@functools.lru_cache(maxsize=64)
def _usage_series(policy: str) -> tuple[Series, ...]:
    """The five series a turn's usage adds to, per policy (looked up once, not per request)."""
    return (
        PROMPT_TOKENS.labels(policy=policy),
        CACHED_TOKENS.labels(policy=policy),
        COST.labels(policy=policy, route="proxied"),
        COST.labels(policy=policy, route="direct"),
        SAVED.labels(policy=policy),
    )


@dataclass(frozen=True)
class TurnInputs:
    """Everything `process()` takes besides the journal and the correction, fixed for the turn."""

    dialect: Dialect
    conversation: Conversation
    policy: Policy
    model: ModelInfo
    counter: TokenCounter
    capsules: tuple[Capsule, ...]
    cuts: CutCache
    cache_key: str | None = None  # the session id, for APIs that route their prompt cache by one
    cache_breakpoints: bool = False  # the dialect may add prompt-cache breakpoints ([anthropic] place_breakpoints)
    cache_cold: bool = False  # the upstream's cache expired since the session's last request (`cache_is_cold`)
    lifetimes: Lifetimes = NO_HISTORY  # how long the agent's finished sessions lasted (`service.session_ends`)
    tools_count: int | None = None  # the tools' tokens, when kept from an earlier turn (`noted_tools_tokens`)

    @property
    def epoch_model(self) -> ModelInfo:
        """The model the epoch rule prices by: a client's 1-hour TTL makes writes dearer than the table's; an API
        that reads the cache only at its marks (Anthropic) rewrites from the last mark before an edit."""
        conversation, model = self.conversation, self.model
        if conversation.marked_cache:
            model = replace(model, marked_cache=True)
        return model if conversation.cache_write_factor is None else writes_at(model, conversation.cache_write_factor)

    def run(self, journal: Journal, correction: float) -> Outcome:
        conversation = self.conversation
        return process(
            journal,
            conversation.messages,
            tools=conversation.tools,
            policy=self.policy,
            model=self.epoch_model,
            counter=self.counter,
            capsules=self.capsules,
            max_output_tokens=conversation.max_output_tokens,
            correction=correction,
            digests=conversation.digests,
            cuts=self.cuts,
            cache_cold=self.cache_cold,
            lifetimes=self.lifetimes,
            tools_count=self.tools_count,
        )


def noted_tools_tokens(notes: dict[str, Any] | None, tools: Any, counter: TokenCounter) -> int:
    """`pipeline.tools_tokens`, kept per encoding in a body memo's notes (they come back only with the same tools),
    so a warm turn does not serialise and hash its tools again."""
    if notes is None:
        return tools_tokens(tools, counter)
    key = f"tools_tokens {counter.name}"
    count = notes.get(key)
    if count is None:
        count = notes[key] = tools_tokens(tools, counter)
    return int(count)


async def _inline(work: Callable[[], T]) -> T:
    return work()


# Added to a TTL before the proxy assumes it ran out: the upstream counts from when it processed the last
# request, a little after the proxy saw it arrive (the proxy's own work, the network, the upstream's queue).
COLD_MARGIN_S = 30.0


def cache_is_cold(model: ModelInfo, conversation: Conversation, idle_s: float) -> bool:
    """Whether the upstream has dropped the session's cached prefix: idle longer than the model's TTL (or the
    longer one the client asked for) and a margin. A model with no TTL is never assumed cold."""
    if model.cache_ttl_s <= 0 or idle_s <= 0:
        return False
    return idle_s > max(model.cache_ttl_s, conversation.cache_ttl_s or 0) + COLD_MARGIN_S


class EngineTurn:
    """One prepared request (`proxy.service.seam.PreparedTurn`): the body to send and what to learn from the answer."""

    def __init__(
        self,
        session: Session,
        inputs: TurnInputs,
        body: dict,
        journal: Journal,
        *,
        store: SessionStore,
        calibration: Calibration,
        serialised: Callable[[Callable[[], Any]], Awaitable[Any]] = _inline,
        sent: SentBodies | None = None,
    ) -> None:
        # Runs engine work for this session: after the session's earlier turns, off the loop if it is big.
        self._serialised = serialised
        self.store = store  # where the session is saved after each change
        self.calibration = calibration  # what the upstream's usage teaches about our counts
        self.session = session
        self.inputs = inputs
        self.client_body = body
        self.journal_before = journal
        self.sent = sent  # the session's last body as sent, for serialising this one (chat)
        self.body: dict = {}
        self.data: bytes | None = None  # `body`'s bytes, when made here (None: the shell serialises it)
        self.headers: dict[str, str] = {}
        self.strip_usage_chunk = False
        self.unchanged = False
        self.untouched = False
        self.stats = TurnStats()
        self.outcome: Outcome | None = None
        self.correction = 1.0
        self.stored_journal: Journal | None = None  # what the session store last wrote for this turn
        self.usage_stored = False
        self.chain: Callable[[Sequence[Mapping[str, Any]]], None] | None = None  # remembers the answer's response id

    @property
    def dialect(self) -> Dialect:
        return self.inputs.dialect

    @property
    def commits(self) -> bool:
        """Whether `commit` writes anything: only a shared store's does (memory and SQLite keep this copy)."""
        return self.store.commits

    @property
    def model(self) -> str:
        return self.inputs.conversation.model

    @property
    def shared_model(self) -> str:
        """The name a shared store learns the model's ratio under: '' for a name no [models] entry but "*"
        lists (a client may send any number of names; only configured ones are shared)."""
        return self.model if self.inputs.model.pattern != "*" else ""

    @property
    def estimate(self) -> float:
        """Our uncorrected count of what was sent (the report's count carries the correction)."""
        return self.outcome.report.tokens_after / self.correction if self.outcome and self.correction > 0 else 0.0

    def apply(self, outcome: Outcome, correction: float, *, retried: bool = False) -> None:
        """Adopt an outcome: the session's journal, the body, headers and this turn's report."""
        self.outcome, self.correction = outcome, correction
        self.session.journal = outcome.journal
        conversation = self.inputs.conversation
        engine_in, out = conversation.messages, outcome.messages
        # The conversation goes upstream as the client sent it: a direct request would have been billed the same.
        self.untouched = len(out) == len(engine_in) and all(a is b for a, b in zip(out, engine_in, strict=True))
        self.unchanged = self.untouched
        body = self.client_body
        if not self.unchanged:
            body = self.dialect.render(body, conversation, out, outcome.sources)
        if self.inputs.cache_key:
            body = self.dialect.with_session(body, self.inputs.cache_key)
        body = self.dialect.with_cache_breakpoints(body, self.inputs.cache_breakpoints)
        self.body, self.strip_usage_chunk = self.dialect.with_usage_requested(body)
        self.unchanged = self.unchanged and self.body is self.client_body
        self.data = None
        if not self.unchanged and self.sent is not None and self.dialect is CHAT:
            key, flags = self.session.id, (self.inputs.cache_key, self.inputs.cache_breakpoints)
            self.data = self.sent.serialise(key, self.client_body, self.body, outcome.sources, flags)
        model = self.inputs.model
        self.headers = {**outcome.report.headers(), "X-Context-Window": str(model.context_window)}
        self.stats.report = outcome.report
        self.stats.model = self.inputs.conversation.model
        self.stats.window, self.stats.model_entry = model.context_window, model.pattern
        self.stats.retried = retried
        self.store.save(self.session)

    def record_usage(self, payloads: Sequence[Mapping[str, Any]]) -> None:
        if self.chain is not None:
            self.chain(payloads)
        usage = self.dialect.usage(payloads)
        if usage is None or self.outcome is None or self.stats.prompt_tokens is not None:
            return
        model = self.inputs.model
        conversation = self.inputs.conversation
        sealed = sealed_parts(self.outcome.messages) if conversation.sealed else (0, 0)
        self.calibration.learn(conversation.model, usage.prompt, self.estimate, sealed)
        direct = self._direct_usage(usage, self.outcome.report)
        self.session.direct_prompt_tokens = direct.prompt
        stats = self.stats
        stats.prompt_tokens, stats.cached_tokens = usage.prompt, usage.cached
        stats.cost_usd = usage.cost_usd(model)
        stats.direct_cost_usd = direct.cost_usd(model)  # priced as the proxied one is: cache writes too
        self.session.count_usage(stats)
        prompt, cached, proxied, direct_cost, saved = _usage_series(self.session.policy)
        prompt.inc(usage.prompt)
        cached.inc(usage.cached)
        proxied.inc(stats.cost_usd)
        direct_cost.inc(stats.direct_cost_usd)
        saved.inc(stats.direct_cost_usd - stats.cost_usd)
        self.store.save(self.session)
        if log.isEnabledFor(logging.INFO):
            self._log_turn(self.outcome.report)

    def _log_turn(self, report: TurnReport) -> None:
        """The turn's one INFO line: what the client sent and what went upstream, the cache, the epoch, the saving."""
        stats = self.stats
        log.info(
            "session %s turn %d (%s, %s): tokens %d -> %d, cached %d, epoch %s, saved $%.4f",
            visible_id(self.session.id),
            report.turn,
            stats.api,
            stats.model[:100],
            report.tokens_before,
            report.tokens_after,
            stats.cached_tokens or 0,
            "+".join(report.reasons) if report.epoch else "no",
            savings(stats.cost_usd or 0.0, stats.direct_cost_usd or 0.0)["saved_usd"],
        )

    def _direct_usage(self, usage: Usage, report: TurnReport) -> Usage:
        """What the same turn would have been billed sent unedited, straight to the upstream."""
        if self.untouched:  # it was sent unedited: the same bill, so a session left alone saves exactly 0
            return usage
        # The unedited request, scaled by the same upstream/estimate ratio; its cache would have held
        # the previous turn's unedited prompt (a client that only appends never breaks its own prefix) ...
        scale = usage.prompt / report.tokens_after if report.tokens_after else 1.0
        direct_prompt = round(report.tokens_before * scale)
        # ... if the upstream's cache was warm at all: no hit on a turn whose prefix we did not change means
        # a cold cache (first turn, expiry, a prompt under its minimum), which direct would have met too.
        warm = self.inputs.model.cache_discount < 1 and (usage.cached > 0 or report.epoch)
        cached = min(self.session.direct_prompt_tokens, direct_prompt) if warm else 0
        # What it did not read it would have written to the cache as the proxied turn did (Anthropic: all of it
        # up to the client's last breakpoint), in the same share and with the same TTLs.
        fresh = usage.prompt - usage.cached
        share = usage.written / fresh if fresh > 0 else float(self.inputs.conversation.marked_cache)
        written = min(direct_prompt - cached, round((direct_prompt - cached) * share))
        hour = round(written * usage.written_1h / usage.written) if usage.written else 0
        return Usage(direct_prompt, cached, written, hour)

    async def commit(self) -> None:
        """Write the turn to the session store: before it is sent (a shared store may re-run it), and its usage."""
        await self.store.commit(self)

    async def realign(self) -> None:
        """Another process wrote this session first: run the turn again on the journal it left."""
        await self._serialised(self._realign)

    def _realign(self) -> None:
        correction = self.calibration.correction(self.inputs.conversation.model, self.session.correction)
        with self.session.lock:
            self.journal_before = self.session.journal
            outcome = self.inputs.run(self.journal_before, correction)
            if outcome.overflow:
                raise ContextOverflow(self.dialect.overflow_message(outcome.overflow))
            self.apply(outcome, correction)

    async def refit(self, reported_prompt_tokens: int) -> dict | None:
        """Re-run the turn from the journal as it was before it, with our count scaled to the upstream's."""
        refitted: dict | None = await self._serialised(functools.partial(self._refit, reported_prompt_tokens))
        return refitted

    def _refit(self, reported_prompt_tokens: int) -> dict | None:
        if self.outcome is None or self.stats.retried or reported_prompt_tokens < 0 or self.estimate <= 0:
            return None
        stated = reported_prompt_tokens > 0
        if not stated:  # too long by an amount the upstream did not say: at least the window
            window = self.inputs.model.context_window - (self.inputs.conversation.max_output_tokens or 0)
            reported_prompt_tokens = max(window, round(self.estimate * self.correction)) + 1
        learned = refit_correction(reported_prompt_tokens, self.estimate, stated=stated)
        self.session.correction = max(self.session.correction, learned)
        RETRIES.inc(policy=self.session.policy)
        margin = self.inputs.model.estimate_margin
        correction = self.calibration.correction(self.inputs.conversation.model, self.session.correction, margin)
        with self.session.lock:
            outcome = self.inputs.run(self.journal_before, correction)
            self.stats.retried = True
            if outcome.overflow or outcome.messages == self.outcome.messages:
                return None
            self.apply(outcome, correction, retried=True)
        return self.body
