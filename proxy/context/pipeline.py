"""One request through the engine: align → replay → (maybe) edit epoch → inject → check.

Pure: takes the session's journal and the client's messages, returns the messages to
send, the next journal and a report. Between epochs the output extends last turn's
output byte for byte, so the upstream's prompt cache keeps hitting; edits come in
rare batches, only when the window demands them or the cache economics say they pay.
Each edit kind lives in `proxy.context.steps`; this module only orders them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.context.capsules import Capsule
from proxy.context.clearing import ClearPlan
from proxy.context.draft import Draft
from proxy.context.economics import billed_input
from proxy.context.inject import drop_capsules, inject_capsules, stale_capsules
from proxy.context.journal import DROPPED, Journal, TurnReport
from proxy.context.messages import Message, call_ids, is_tool_output, message_digest, newest
from proxy.context.misses import index_removed, observe_newest
from proxy.context.patterns import compile_patterns
from proxy.context.policy import ModelInfo, Policy
from proxy.context.steps import Compaction, CutCache, Dedup, Epoch, steps
from proxy.context.steps.clear import Clearing
from proxy.context.survival import NO_HISTORY, Lifetimes
from proxy.context.tokens import REPLY_PRIMING, Counter, canonical_bytes

__all__ = ["Outcome", "Overflow", "TurnReport", "process"]


@dataclass(frozen=True)
class Overflow:
    """A request the upstream would refuse: it needs more than the model's window."""

    window: int
    prompt_tokens: int
    reserve: int  # tokens kept for the completion

    def message(self) -> str:
        """OpenAI's `context_length_exceeded` wording (clients and our own refit parse it)."""
        return (
            f"This model's maximum context length is {self.window} tokens. However, you requested "
            f"{self.prompt_tokens + self.reserve} tokens ({self.prompt_tokens} in the messages, {self.reserve} in the "
            "completion). Please reduce the length of the messages or completion."
        )


@dataclass
class Outcome:
    """What to send upstream, the session's next journal, the report; `overflow` when it cannot fit.

    `sources[j]` is the index of the client message `messages[j]` renders, -1 for one the engine inserted.
    """

    messages: list[Message]
    journal: Journal
    report: TurnReport
    overflow: Overflow | None = None
    sources: list[int] = field(default_factory=list)


def process(
    journal: Journal,
    messages: list[Message],
    *,
    tools: Any,
    policy: Policy,
    model: ModelInfo,
    counter: Counter,
    capsules: Sequence[Capsule] = (),
    max_output_tokens: int | None = None,
    correction: float = 1.0,
    digests: Sequence[bytes] | None = None,
    cuts: CutCache | None = None,
    cache_cold: bool = False,
    lifetimes: Lifetimes = NO_HISTORY,
    tools_count: int | None = None,
) -> Outcome:
    """The messages to forward for this turn; does not mutate `journal` (but for the index of where its outputs'
    lines stand, kept in this process only, which only grows and is checked against the journal before each use:
    `compact.StandingIndex`).

    `digests`, when the caller has them, are the messages' `message_digest`s (not recomputed);
    `cuts` is the caller's cache of head+tail cuts (a fresh one when it keeps none); `cache_cold`: the
    upstream's prompt cache has expired since the session's last request (the caller knows the clock);
    `lifetimes`: how long the agent's finished sessions lasted (`survival.Lifetimes`; none: the rule without history);
    `tools_count`: `tools_tokens(tools, counter)`, when the caller kept it from an earlier turn with the same tools.
    """
    edits = steps(cuts if cuts is not None else CutCache())
    state = journal.copy()
    reserve = reply_room(model, policy, max_output_tokens)
    draft = Draft(
        messages=messages,
        journal=state,
        policy=policy,
        model=model,
        counter=counter,
        usable=max(0, model.context_window - reserve),
        fixed=(tools_tokens(tools, counter) if tools_count is None else tools_count) + REPLY_PRIMING,
        correction=correction,
        emitters={step.kind: step.emit for step in edits},
        observations=compile_patterns(policy.clear_tool_outputs.observation_patterns),
        cold=cache_cold,
        lifetimes=lifetimes,
    )
    if digests is None:
        digests = [message_digest(m) for m in messages]
    draft.first_new = _whole_unit(state, messages, state.align(digests))
    if state.edited is not None:  # the last turn's edited contents, while its messages lead this one
        draft.carried, draft.reusable = state.edited, state.edited.reusable(state)
    compaction = next(step for step in edits if isinstance(step, Compaction))
    deduped, compacted = _record(draft, digests, compaction)
    out, counts = draft.render()
    report = TurnReport(turn=state.turn + 1, tokens_before=draft.total(state.tokens), tokens_after=0, deduped=deduped)
    report.over_window = draft.over_window = report.tokens_before > draft.usable
    report.recall_missed, report.reruns = observe_newest(draft, out)
    compacted_at = None  # the output index of last request's newest message, when it is compacted now
    if (newest := compaction.after_newest(draft)) is not None:
        out, counts = draft.render()
        compacted_at, compacted = draft.where[newest], compacted + 1
    report.compacted = compacted
    epoch = _epoch_needed(draft, out, counts)
    report.held_back = draft.held_back
    if stale := stale_capsules(state, capsules):  # a capsule removed or changed in the config leaves the body
        epoch = Epoch((*epoch.reasons, "capsules"), epoch.plan) if epoch else Epoch(("capsules",))
    if epoch is not None:
        report.epoch, report.reasons = True, epoch.reasons
        state.unpaid_bound = 0
        before = list(state.decisions)
        for step in edits:
            step.edit(draft, epoch, report)
        drop_capsules(state, stale, capsules)
        index_removed(draft, before)
        new_out, counts = draft.render()
        report.first_changed = _first_difference(out, new_out)
        out = new_out
    if compacted_at is not None:
        report.first_changed = compacted_at if report.first_changed is None else min(compacted_at, report.first_changed)
    report.diff = inject_capsules(state, messages, draft.first_new, policy.capsules, counter, capsules)
    if report.diff.added:
        out, counts = draft.render()
    report.tokens_after = draft.total(counts)
    sources = draft.sources(len(out))
    if report.tokens_after > draft.usable:
        overflow = (
            Overflow(model.context_window, report.tokens_after, reserve)
            if model.max_tokens_in_window
            else Overflow(draft.usable, report.tokens_after, 0)  # max_tokens is no part of it: the prompt is too long
        )
        return Outcome(out, journal, report, overflow, sources)
    if not report.over_window:  # sent as the client wrote it, the upstream would refuse it: nothing to save against
        state.banked += _turn_saving(draft, counts, report.first_changed)
        state.direct += draft.direct_bill()
    report.banked = round(state.banked, 1)
    state.record(report)
    state.edited = draft.carry()
    return Outcome(out, state, report, None, sources)


def _whole_unit(journal: Journal, messages: Sequence[Message], first_new: int) -> int:
    """Where the turn's new messages start, moved back to the call their first one answers when an earlier epoch
    dropped it: a client that rewrites a tool result whose call the journal dropped (Claude Code clears old results
    itself) would otherwise send that result with no call before it, which the upstream refuses. The unit is then
    decided anew, whole (the journal forgets it); the client's edit already broke the cached prefix there."""
    if not 0 < first_new < len(messages) or messages[first_new].get("role") != "tool":
        return first_new
    start = first_new - 1
    while start > 0 and messages[start].get("role") == "tool":
        start -= 1
    dropped = any(journal.decisions[k].kind == DROPPED for k in range(start, first_new))
    if not call_ids(messages[start]) or not dropped:
        return first_new
    journal.cut(start)
    return start


def reply_room(model: ModelInfo, policy: Policy, max_output_tokens: int | None) -> int:
    """Tokens of the window kept free for the reply: the request's max_tokens where the upstream counts it against
    the window (`ModelInfo.max_tokens_in_window`), else at most `reserve_output_tokens` (the policy's room when
    the request names none)."""
    if not max_output_tokens:
        return policy.reserve_output_tokens
    return max_output_tokens if model.max_tokens_in_window else min(max_output_tokens, policy.reserve_output_tokens)


def _record(draft: Draft, digests: Sequence[bytes], compaction: Compaction) -> tuple[int, int]:
    """Journal the messages new this turn; a new output the agent has read is deduplicated or compacted at once.

    Returns how many were deduplicated and how many compacted."""
    dedup, messages, state = Dedup(), draft.messages, draft.journal
    deduped = compacted = 0
    unread = newest(messages)
    for i in range(draft.first_new, len(messages)):
        tokens = draft.counter.count_message(messages[i], digests[i])
        output = is_tool_output(messages[i], draft.observations)
        state.append(digests[i], tokens, tokens, output)
        if output and draft.policy.dedup and dedup.arrived(draft, i, tokens):
            deduped += 1
        elif output and i < unread:
            compacted += compaction.arrived(draft, i)
    return deduped, compacted


def _epoch_needed(draft: Draft, out: list[Message], counts: list[int]) -> Epoch | None:
    """Why this turn needs an edit epoch (None when it does not), with the clearing plan if one was made."""
    policy = draft.policy
    total = draft.total(counts)
    reasons = []
    if total > draft.usable or (
        total > policy.high_water * draft.usable and _window_pays_early(draft, out, counts, total)
    ):
        reasons.append("window")
    if policy.soft_budget_tokens and total > policy.soft_budget_tokens:
        reasons.append("soft_budget")
    plan: ClearPlan | None = None
    if policy.clear_tool_outputs.enabled and (reasons or not policy.lossless):  # lossless: clears only when forced
        plan = Clearing().plan(draft, out, counts, forced=bool(reasons))
    if plan is not None and plan.ids and not reasons:
        reasons.append("clearing")
    if reasons and draft.cold:
        reasons.append("cache_cold")
    return Epoch(tuple(reasons), plan) if reasons else None


def _window_pays_early(draft: Draft, out: list[Message], counts: list[int], total: int) -> bool:
    """Whether to make the epoch the window will force now, the request (`total` tokens) above `high_water` but
    still within the window: priced as a voluntary edit would be, it pays at once where the cache is dear (d = 1)
    or cold, and at a cheap cached price only where the session's bank or its agent's history covers the rewrite.
    Made early regardless, a session that ends before its requests outgrow the window bills that rewrite above
    what it would have billed direct (`python -m bench quality`, 32k, d = 0.1: sample B's sympy-23413 at 1.185).

    The epoch is taken to free down to `low_water` from the oldest turn truncation may drop (before any output
    clearing may take)."""
    policy = draft.policy
    freed = int((total - policy.low_water * draft.usable) / draft.correction)
    droppable = ("assistant",) if policy.pin_first_user else ("user", "assistant", "tool")
    first = next((j for j, m in enumerate(out) if m.get("role") in droppable), len(out))
    return draft.edit_value()(freed, draft.position(counts, first), draft.cached_end(counts) - freed) > 0


def _turn_saving(draft: Draft, counts: list[int], first_changed: int | None) -> float:
    """Billed tokens this request saves against the client's own, each read from the cache up to what it
    shares with the one before it: what the edits bank (`economics.within_budget`)."""
    d, w = draft.discount, draft.model.write_factor
    new = draft.new_at(len(counts))
    if first_changed is not None:
        new = min(new, first_changed)
    sent_new = sum(counts[new:])
    return draft.direct_bill() - billed_input(d, w, sum(counts) - sent_new, sent_new)


def _first_difference(before: list[Message], after: list[Message]) -> int | None:
    for k, (old, new) in enumerate(zip(before, after, strict=False)):
        if old is not new and old != new:
            return k
    return None if len(before) == len(after) else min(len(before), len(after))


def tools_tokens(tools: Any, counter: Counter) -> int:
    """The `tools` schema's tokens: sent with every request, it counts against the window."""
    return counter.count_text(canonical_bytes(tools).decode()) if tools else 0
