"""One request through the engine: align → replay → (maybe) edit epoch → inject → check.

Pure: takes the session's journal and the client's messages, returns the messages to
send, the next journal and a report. Between epochs the output extends last turn's
output byte for byte, so the upstream's prompt cache keeps hitting; edits come in
rare batches, only when the window demands them or the cache economics say they pay.
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.context.capsules import Capsule
from proxy.context.clearing import PLACEHOLDER, ClearPlan, ClearToolOutputs
from proxy.context.dedup import MIN_TOKENS, body_digest, duplicates, reference, with_reference
from proxy.context.economics import epoch_pays
from proxy.context.fitting import cut_oversized, fit_messages, omission_note, oversized_limit
from proxy.context.inject import inject_capsules
from proxy.context.journal import CLEARED, CUT, DEDUPED, DROPPED, KEEP, KEPT, Decision, Injection, Journal, TurnReport
from proxy.context.messages import Message, compile_patterns, is_tool_output, message_digest
from proxy.context.policy import ModelInfo, Policy
from proxy.context.tokens import REPLY_PRIMING, Counter, canonical_bytes

__all__ = ["Outcome", "TurnReport", "process"]

_CLEARED = Decision(CLEARED)
_DROPPED = Decision(DROPPED)
# Tool outputs among the last this many messages are never cleared, whatever `keep_tokens` says.
RECENT_MESSAGES = 6
# A clearing plan that did not pay is made again only once its bound has grown by `clear_at_least`
# and by 1/REPLAN_GROWTH of itself: a plan walks the whole conversation, so on a long one this
# keeps planning to one turn in many instead of every turn that adds a tool output.
REPLAN_GROWTH = 8


@dataclass
class Outcome:
    """What to send upstream, the session's next journal, the report; `rejected` = a local 400's message.

    `sources[j]` is the index of the client message `messages[j]` renders, -1 for one the engine inserted.
    """

    messages: list[dict]
    journal: Journal
    report: TurnReport
    rejected: str | None = None
    sources: list[int] = field(default_factory=list)


_cuts: OrderedDict[tuple[bytes, int], Any] = OrderedDict()  # (digest, max_tokens) -> cut content
_cuts_lock = threading.Lock()
_MISSING = object()


@dataclass
class _Turn:
    """One request's inputs and the journal being edited."""

    messages: list[Message]
    state: Journal
    policy: Policy
    model: ModelInfo
    counter: Counter
    usable: int
    fixed: int  # the tools schema and the reply priming
    correction: float
    observations: tuple[re.Pattern[str], ...] = ()
    first_new: int = 0  # messages before this index were in last turn's request
    where: list[int] = field(default_factory=list)  # output index per client message, -1 when dropped

    def total(self, counts: Sequence[int]) -> int:
        return math.ceil((sum(counts) + self.fixed) * self.correction)

    def emitted(self, i: int) -> Message | None:
        """What the journal's decision sends for client message `i` (None when dropped)."""
        message, decision = self.messages[i], self.state.decisions[i]
        kind = decision.kind
        if kind == KEEP:
            return message
        if kind == CLEARED:
            return {**message, "content": PLACEHOLDER}
        if kind == DEDUPED:
            return with_reference(message, decision.reference)
        if kind == CUT:
            return _cut(message, self.state.digests[i], decision.max_tokens, self.counter)
        return None

    def render(self) -> tuple[list[Message], list[int]]:
        """The output messages and their counts: decisions replayed, injections and omission notes in place."""
        out: list[Message] = []
        counts: list[int] = []
        where: list[int] = []
        anchored: dict[int, list[Injection]] = {}
        for injection in self.state.injections:
            anchored.setdefault(injection.anchor, []).append(injection)
        decisions, sent = self.state.decisions, self.state.sent
        note_at, run = -1, 0
        # Runs every turn over the whole conversation: a message kept as sent takes the short path.
        for i, message in enumerate(self.messages):
            if anchored and i in anchored:
                for injection in anchored[i]:
                    out.append(injection.message())
                    counts.append(self.counter.count_message(out[-1]))
            emitted = message if decisions[i] is KEPT else self.emitted(i)
            if emitted is None:
                if run == 0:
                    note_at = len(out)
                    out.append({})
                    counts.append(0)
                run += 1
                where.append(-1)
                continue
            if run:
                out[note_at] = omission_note(run)
                counts[note_at] = self.counter.count_message(out[note_at])
                run = 0
            where.append(len(out))
            out.append(emitted)
            counts.append(sent[i])
        self.where = where
        return out, counts

    def decide(self, i: int, decision: Decision) -> None:
        """Record a new decision for message `i`, with the tokens it now sends."""
        self.state.decisions[i] = decision
        emitted = self.emitted(i)
        self.state.sent[i] = 0 if emitted is None else self.counter.count_message(emitted)


def _cut(message: Message, digest: bytes, max_tokens: int, counter: Counter) -> Message:
    """The head+tail cut of a message, cached: re-cutting would re-tokenize a huge text every turn."""
    key = (digest, max_tokens)
    content = _cuts.get(key, _MISSING)
    if content is _MISSING:
        cut = cut_oversized(message, counter, max_tokens)
        content = message.get("content") if cut is None else cut["content"]
        with _cuts_lock:  # the proxy may run the engine on a worker thread as well as on its event loop
            _cuts[key] = content
            if len(_cuts) > 1024:
                _cuts.popitem(last=False)
    return {**message, "content": content}


def process(
    journal: Journal,
    messages: list[dict],
    *,
    tools: list | None,
    policy: Policy,
    model: ModelInfo,
    counter: Counter,
    capsules: Sequence[Capsule] = (),
    max_output_tokens: int | None = None,
    correction: float = 1.0,
    digests: Sequence[bytes] | None = None,
) -> Outcome:
    """The messages to forward for this turn; does not mutate `journal`.

    `digests`, when the caller has them, are the messages' `message_digest`s (not recomputed).
    """
    state = journal.copy()
    reserve = max_output_tokens or policy.reserve_output_tokens
    tools_tokens = counter.count_text(_tools_text(tools)) if tools else 0
    turn = _Turn(
        messages=messages,
        state=state,
        policy=policy,
        model=model,
        counter=counter,
        usable=max(0, model.context_window - reserve),
        fixed=tools_tokens + REPLY_PRIMING,
        correction=correction,
        observations=compile_patterns(policy.clear_tool_outputs.observation_patterns),
    )
    if digests is None:
        digests = [message_digest(m) for m in messages]
    turn.first_new = state.align(digests)
    deduped = _record(turn, turn.first_new, digests)
    out, counts = turn.render()
    report = TurnReport(turn=state.turn + 1, tokens_before=turn.total(state.tokens), tokens_after=0, deduped=deduped)
    reasons, plan = _triggers(turn, out, counts)
    if reasons:
        _epoch(turn, reasons, plan, report)
        new_out, counts = turn.render()
        report.first_changed = _first_difference(out, new_out)
        out = new_out
    report.diff = inject_capsules(state, messages, turn.first_new, policy.capsules, counter, capsules)
    if report.diff.added:
        out, counts = turn.render()
    report.tokens_after = turn.total(counts)
    rejected = _check(turn, report.tokens_after, reserve)
    sources = [-1] * len(out)
    for i, j in enumerate(turn.where):
        if j >= 0:
            sources[j] = i
    if rejected is not None:
        return Outcome(out, journal, report, rejected, sources)
    state.record(report)
    return Outcome(out, state, report, None, sources)


def _tools_text(tools: Any) -> str:
    return canonical_bytes(tools).decode()


def _record(turn: _Turn, aligned: int, digests: Sequence[bytes]) -> int:
    """Journal the messages new this turn; a new non-last duplicate output is deduplicated at once."""
    state, messages = turn.state, turn.messages
    last = len(messages) - 1
    deduped = 0
    for i in range(aligned, len(messages)):
        message = messages[i]
        tokens = turn.counter.count_message(message, digests[i])
        output = is_tool_output(message, turn.observations)
        state.append(digests[i], tokens, tokens, output)
        body = body_digest(message) if output and turn.policy.dedup else None
        if body is None:
            continue
        target = state.bodies.get(body)
        if target is None or state.decisions[target] is not KEPT:
            state.bodies[body] = i
        elif i != last and tokens >= MIN_TOKENS:
            turn.decide(i, Decision(DEDUPED, reference=reference(messages[target]), target=target))
            deduped += 1
    return deduped


def _triggers(turn: _Turn, out: list[Message], counts: list[int]) -> tuple[list[str], ClearPlan | None]:
    """Why this turn needs an edit epoch ([] when it does not), and the clearing plan if one was made."""
    policy = turn.policy
    total = turn.total(counts)
    reasons = []
    if total > policy.high_water * turn.usable:
        reasons.append("window")
    if policy.soft_budget_tokens and total > policy.soft_budget_tokens:
        reasons.append("soft_budget")
    plan = _clearing(turn, out, counts, forced=bool(reasons)) if policy.clear_tool_outputs.enabled else None
    if plan is not None and plan.ids and not reasons:
        reasons.append("clearing")
    return reasons, plan


def _clearing(turn: _Turn, out: list[Message], counts: list[int], *, forced: bool) -> ClearPlan | None:
    """The clearing plan when it frees `clear_at_least` and pays (or the window forces it); else None.

    A bound from the journal alone rules most turns out before any plan is made.
    """
    rules = turn.policy.clear_tool_outputs
    keep_tokens = max(rules.keep_tokens, _recent_output_tokens(turn))
    bound = _clearing_bound(turn, keep_tokens)
    if bound is None or bound[0] < max(1, rules.clear_at_least):
        return None
    freed, newest = bound
    unpaid = turn.state.unpaid_bound
    if not forced and unpaid and freed < unpaid + max(rules.clear_at_least, unpaid // REPLAN_GROWTH):
        return None
    total = turn.total(counts)
    turns = sum(1 for m in turn.messages if m.get("role") == "assistant")
    d = turn.model.cache_discount

    def pays(freed: int, first: int) -> bool:
        return epoch_pays(discount=d, tokens_after=total - freed, first_changed=first, freed=freed, turns_so_far=turns)

    def position(j: int) -> int:
        """The token position where output message `j` starts (the tools schema comes first)."""
        return turn.fixed - REPLY_PRIMING + sum(counts[:j])

    if not forced and not pays(freed, position(turn.where[newest])):
        return None
    clear = replace(ClearToolOutputs.from_policy(rules), keep_tokens=keep_tokens)
    visible, digests = _visible_output(turn, out)
    plan = clear.plan(visible, turn.counter, digests)
    paid = bool(plan.ids) and (
        forced or pays(plan.tokens, position(_visible_to_output(turn, min(plan.indices(visible, digests)))))
    )
    if not paid:
        if not forced:
            turn.state.unpaid_bound = freed
        return None
    return plan


def _recent_output_tokens(turn: _Turn) -> int:
    """Tokens of the tool outputs among the last `RECENT_MESSAGES` sent: the agent is working with them."""
    state, seen, tokens = turn.state, 0, 0
    for i in range(len(state) - 1, -1, -1):
        if state.decisions[i].kind == DROPPED:
            continue
        if state.outputs[i] and state.decisions[i].kind != CLEARED:
            tokens += state.sent[i]
        seen += 1
        if seen == RECENT_MESSAGES:
            break
    return tokens


def _clearing_bound(turn: _Turn, keep_tokens: int) -> tuple[int, int] | None:
    """An upper bound on what clearing frees, and the newest output it could clear, from the journal's counts."""
    state = turn.state
    kept, boundary = 0, -1
    for i in range(len(state) - 1, -1, -1):
        if state.outputs[i] and state.decisions[i].kind not in (CLEARED, DROPPED):
            kept += state.sent[i]
            if kept > keep_tokens:
                boundary = i
                break
    if boundary < 0:
        return None
    last = len(state) - 1
    freed = sum(
        state.sent[i] for i in range(boundary + 1) if state.outputs[i] and state.decisions[i] is KEPT and i != last
    )
    return freed, boundary


def _visible_output(turn: _Turn, out: list[Message]) -> tuple[list[Message], list[bytes]]:
    """What is sent for the client's messages still present, and its digests.

    A message sent as the client wrote it has the digest the journal already holds: only edited ones are hashed.
    """
    visible, digests = [], []
    for i, j in enumerate(turn.where):
        if j >= 0:
            sent = out[j]
            visible.append(sent)
            digests.append(turn.state.digests[i] if sent is turn.messages[i] else message_digest(sent))
    return visible, digests


def _visible_to_output(turn: _Turn, visible_index: int) -> int:
    return [j for j in turn.where if j >= 0][visible_index]


def _visible(turn: _Turn) -> list[int]:
    return [i for i, j in enumerate(turn.where) if j >= 0]


def _epoch(turn: _Turn, reasons: list[str], plan: ClearPlan | None, report: TurnReport) -> None:
    """One batch of edits: clearing, dedup of older duplicates, then (window or budget) cuts and truncation."""
    report.epoch, report.reasons = True, tuple(reasons)
    turn.state.unpaid_bound = 0
    out, _ = turn.render()
    visible = _visible(turn)
    if plan is not None:
        planned = plan.indices(*_visible_output(turn, out))
        for v in planned:
            turn.decide(visible[v], _CLEARED)
        report.cleared = len(planned)
    if turn.policy.dedup:
        report.deduped += _dedup_older(turn, visible)
    _release_dangling(turn, visible)
    if "window" in reasons or "soft_budget" in reasons:
        report.cut = _cut_oversized(turn, visible)
        report.removed = _truncate(turn)


def _dedup_older(turn: _Turn, visible: list[int]) -> int:
    state, last = turn.state, len(turn.messages) - 1
    candidates = [i for i in visible if state.outputs[i] and state.decisions[i] is KEPT and i != last]
    found = duplicates(turn.messages, candidates, state.tokens)
    for i, target in found.items():
        turn.decide(i, Decision(DEDUPED, reference=reference(turn.messages[target]), target=target))
    return len(found)


def _release_dangling(turn: _Turn, visible: list[int]) -> None:
    """A reference whose original was cleared, cut or dropped gets its body back; the body map is rebuilt."""
    state = turn.state
    for i in visible:
        decision = state.decisions[i]
        if decision.kind == DEDUPED and state.decisions[decision.target] is not KEPT:
            turn.decide(i, KEPT)
    bodies = {body: i for body, i in state.bodies.items() if state.decisions[i] is KEPT}
    for i in visible:
        if state.outputs[i] and state.decisions[i] is KEPT and i not in bodies.values():
            body = body_digest(turn.messages[i])
            if body is not None:
                bodies.setdefault(body, i)
    state.bodies = bodies


def _cut_oversized(turn: _Turn, visible: list[int]) -> int:
    """Cut every kept message but the last that alone exceeds `max_message_share` of the window."""
    limit = oversized_limit(turn.usable, turn.policy.max_message_share)
    cut = 0
    for i in visible[:-1]:
        message = turn.messages[i]
        if turn.state.decisions[i] is not KEPT or turn.state.sent[i] <= limit:
            continue
        # `_cut` caches the cut it makes, so recording the decision below does not cut the message again.
        if _cut(message, turn.state.digests[i], limit, turn.counter)["content"] != message.get("content"):
            turn.decide(i, Decision(CUT, max_tokens=limit))
            cut += 1
    return cut


def _truncate(turn: _Turn) -> int:
    """Remove whole units down to the low-water mark (or under the soft budget); returns messages removed."""
    policy = turn.policy
    out, counts = turn.render()
    target = policy.low_water * turn.usable
    if policy.soft_budget_tokens:
        target = min(target, policy.soft_budget_tokens * policy.low_water / policy.high_water)
    if turn.total(counts) <= target:
        return 0
    visible = _visible(turn)
    rows = [turn.where[i] for i in visible]
    fixed = turn.fixed + sum(counts) - sum(counts[j] for j in rows)
    fit = fit_messages(
        [out[j] for j in rows],
        [counts[j] for j in rows],
        budget=int(turn.usable / turn.correction),
        target=int(target / turn.correction),
        strategy=policy.truncation,
        pin_first_user=policy.pin_first_user,
        fixed_tokens=fixed,
        counter=turn.counter,
    )
    for i, keep in zip(visible, fit.keep, strict=True):
        if not keep:
            turn.decide(i, _DROPPED)
    return fit.removed


def _first_difference(before: list[Message], after: list[Message]) -> int | None:
    for k, (old, new) in enumerate(zip(before, after, strict=False)):
        if old is not new and old != new:
            return k
    return None if len(before) == len(after) else min(len(before), len(after))


def _check(turn: _Turn, tokens: int, reserve: int) -> str | None:
    """OpenAI's context_length_exceeded message when the request cannot fit; None when it can."""
    if tokens <= turn.usable:
        return None
    return (
        f"This model's maximum context length is {turn.model.context_window} tokens. However, you requested "
        f"{tokens + reserve} tokens ({tokens} in the messages, {reserve} in the completion). "
        "Please reduce the length of the messages or completion."
    )
