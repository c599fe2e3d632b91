"""The counters each engine turn adds to `/metrics`, and the memory parts it sets (`EngineService` counts them)."""

from __future__ import annotations

import functools

from proxy.context.journal import TurnReport
from proxy.metrics import METRICS, Series
from proxy.state.memory import HELD as MEMORY_HELD

_POLICY = ("policy",)

TOKENS_BEFORE = METRICS.counter(
    "context_proxy_tokens_before_total", "Prompt tokens the clients sent (estimated)", _POLICY
)
TOKENS_AFTER = METRICS.counter(
    "context_proxy_tokens_after_total", "Prompt tokens forwarded upstream (estimated)", _POLICY
)
TOKENS_SAVED = METRICS.counter(
    "context_proxy_tokens_saved_total", "Prompt tokens the engine removed (estimated)", _POLICY
)
EPOCHS = METRICS.counter("context_proxy_epochs_total", "Turns whose edit epoch changed the forwarded prefix", _POLICY)
RECALL_MISSES = METRICS.counter(
    "context_proxy_recall_misses_total",
    "Turns whose agent message used what only content the proxy removed held",
    _POLICY,
)
RERUNS = METRICS.counter(
    "context_proxy_cleared_reruns_total", "Calls the agent re-ran after the proxy cleared their output", _POLICY
)
MESSAGES_REUSED = METRICS.counter(
    "context_proxy_messages_reused_total", "Messages taken from the session's last body instead of parsed again"
)

# The memory gauge's parts the engine service sets on every turn, each series looked up once.
HELD_MEMOS = MEMORY_HELD.labels(part="body_memos")
HELD_CUTS = MEMORY_HELD.labels(part="cut_contents")
HELD_SENT = MEMORY_HELD.labels(part="sent_bodies")
HELD_TOKENS = MEMORY_HELD.labels(part="token_sets")
HELD_CONVERSATIONS = MEMORY_HELD.labels(part="conversations")


@functools.lru_cache(maxsize=64)
def _series(policy: str) -> tuple[Series, ...]:
    """The six series of one policy (each turn changes three to six of them: the label looked up once)."""
    metrics = (TOKENS_BEFORE, TOKENS_AFTER, TOKENS_SAVED, EPOCHS, RECALL_MISSES, RERUNS)
    return tuple(metric.labels(policy=policy) for metric in metrics)


def count_turn(policy: str, report: TurnReport) -> None:
    """A new turn's tokens before and after, and whether it made an epoch, missed a recall or saw a re-run."""
    before, after, saved, epochs, misses, reruns = _series(policy)
    before.inc(report.tokens_before)
    after.inc(report.tokens_after)
    saved.inc(max(0, report.tokens_before - report.tokens_after))
    if report.epoch:
        epochs.inc()
    if report.recall_missed:
        misses.inc()
    if report.reruns:
        reruns.inc(report.reruns)
