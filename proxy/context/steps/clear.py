"""Clearing: older tool outputs become the placeholder (seed `ClearToolOutputs`), planned only when it pays."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from proxy.context import stubs
from proxy.context.clearing import FRONTIER_MIN_CHARS, PLACEHOLDER, ClearPlan, ClearToolOutputs, is_cleared
from proxy.context.compact import decode, encode, sources_of
from proxy.context.draft import Draft
from proxy.context.journal import AS_SENT, CLEARED, COMPACTED, DEDUPED, DROPPED, Decision, TurnReport
from proxy.context.messages import Message, content_text, ids_at, is_tool_output, newest
from proxy.context.policy import ClearPolicy
from proxy.context.recall import message_tokens, never_edited, outputs_in_use
from proxy.context.steps.base import Epoch
from proxy.context.steps.compact import Compaction

# Tool outputs among the last this many messages are never cleared, whatever `keep_tokens` says.
RECENT_MESSAGES = 6
# A clearing plan that did not pay is made again only once its bound has grown by `clear_at_least`
# and by 1/REPLAN_GROWTH of itself: a plan walks the whole conversation, so on a long one this
# keeps planning to one turn in many instead of every turn that adds a tool output.
REPLAN_GROWTH = 8
# A cleared output's stub keeps at most this share of its tokens (and at most `stub_tokens`, or
# `forced_stub_tokens` where the window forces the epoch).
STUB_SHARE = 0.3
# For an agent its history trusts to work from the newest output (`reach.Reach.trusts_newest`): an epoch may clear
# from this many tokens on, and outputs from this size. `python -m bench reach`, others A with the history of the
# agent's other runs (`kind`), d = 1: 1000 / 100 (the policy's) 0.858, 100 / 100 0.797, 100 / 20 0.785, 50 / 20 0.780.
TRUSTED_CLEAR_AT_LEAST = 100
TRUSTED_KEEP_UNDER = 20
_CLEARED = Decision(CLEARED)


class Clearing:
    kind = CLEARED

    def emit(self, draft: Draft, i: int, decision: Decision) -> Message:
        message = draft.messages[i]
        if not decision.reference:
            return {**message, "content": PLACEHOLDER}
        return {**message, "content": stubs.render(content_text(message) or "", stubs.decode(decision.reference))}

    def edit(self, draft: Draft, epoch: Epoch, report: TurnReport) -> None:
        if epoch.plan is None:
            return
        out, _ = draft.render()
        visible = draft.visible()
        planned = [visible[v] for v in epoch.plan.indices(*draft.visible_output(out))]
        for i, decision in zip(planned, _stubbed(draft, planned, forced=epoch.over_budget), strict=True):
            draft.decide(i, decision)
        report.cleared = len(planned)

    def plan(self, draft: Draft, out: list[Message], counts: list[int], *, forced: bool) -> ClearPlan | None:
        """The clearing plan when it frees `clear_at_least` and pays (or the window forces it); else None.

        A bound from the journal alone rules most turns out before any plan is made.
        """
        rules, keep_tokens = _rules(draft)
        bound = _clearing_bound(draft, keep_tokens)
        if bound is None or bound[0] < max(1, rules.clear_at_least):
            return None
        freed, newest = bound
        unpaid = draft.journal.unpaid_bound
        if (
            not forced
            and not draft.cold
            and unpaid
            and freed < unpaid + max(rules.clear_at_least, unpaid // REPLAN_GROWTH)
        ):
            draft.held_back = freed
            return None
        priced = draft.edit_value()
        floor = _frontier(draft, out) if draft.model.marked_cache else None

        def position(j: int) -> int:
            """The token position where the rewrite of an edit at output message `j` starts: the message's own,
            or the frontier's, where a marked cache can read no further."""
            return draft.position(counts, j if floor is None else min(j, floor))

        cached = draft.cached_end(counts)

        def value(freed: int, first: int, grown: int = 0) -> float:
            """The net saving expected of freeing `freed` tokens from token `first` on, counting the `grown` tokens
            compacted outputs pointing into the cleared ones stand whole again by (-1: beyond the budget)."""
            return priced(freed, first, cached - freed, grown)

        if not forced and value(freed, position(draft.where[newest])) <= 0:
            draft.held_back = freed
            return None
        clear = replace(ClearToolOutputs.from_policy(rules), keep_tokens=keep_tokens)
        visible, digests = draft.visible_output(out)
        whole = clear.plan(visible, draft.counter, digests)
        plan = _spare_in_use(draft, whole, visible, digests, rules)
        if plan.ids and not forced:

            def paying(plan: ClearPlan) -> ClearPlan:
                return _paying_part(
                    draft, plan, visible, digests, rules, lambda freed, j, grown: value(freed, position(j), grown)
                )

            chosen = paying(plan)
            if not chosen.ids and plan is not whole:
                chosen = paying(whole)  # sparing what the agent quotes never stops an epoch that pays
            plan = chosen
        if not plan.ids:
            if not forced:
                draft.journal.unpaid_bound = draft.held_back = freed
            return None
        return plan


def _stubbed(draft: Draft, cleared: list[int], *, forced: bool) -> list[Decision]:
    """The decision for each client message `cleared`: a stub keeping the lines holding what the agent wrote
    (`stubs.choose_lines`), within `STUB_SHARE` of the output and `stub_tokens`; or the placeholder when it
    quoted too little from it (or stubs are off).

    In an epoch the window (or the soft budget) forces, the budget is `forced_stub_tokens` when larger, and what
    the agent wrote counts from the start of the session: truncation drops its older messages in the same epoch,
    so a token it quoted before reading the output may stand nowhere else once the output is cleared. Otherwise
    only what it wrote after reading the output counts (its own messages still hold the rest)."""
    rules = draft.policy.clear_tool_outputs
    stub_tokens = max(rules.stub_tokens, rules.forced_stub_tokens) if forced else rules.stub_tokens
    if stub_tokens <= 0 or not cleared:
        return [_CLEARED] * len(cleared)
    messages = draft.messages
    fixed = never_edited(messages)
    quoted_after: dict[int, frozenset[str]] = {}
    quoted: frozenset[str] = frozenset()
    wanted = set(cleared)
    for i in range(len(messages) - 1, min(cleared) - 1, -1):
        if i in wanted:
            quoted_after[i] = quoted
        elif messages[i].get("role") == "assistant":
            quoted = quoted | (message_tokens(messages[i]) - fixed)
    if forced:
        before = (message_tokens(m) for m in messages[: min(cleared)] if m.get("role") == "assistant")
        quoted_after = dict.fromkeys(cleared, quoted.union(*before) - fixed)
    decisions = []
    for i in cleared:
        text = content_text(messages[i])
        budget = min(stub_tokens, int(STUB_SHARE * draft.journal.tokens[i]))
        lines = stubs.choose_lines(text, quoted_after[i], budget, draft.counter) if text else ()
        decisions.append(Decision(CLEARED, reference=stubs.encode(lines)) if lines else _CLEARED)
    return decisions


def _paying_part(
    draft: Draft,
    plan: ClearPlan,
    visible: list[Message],
    digests: list[bytes],
    rules: ClearPolicy,
    value: Callable[[int, int, int], float],
) -> ClearPlan:
    """The newest outputs of the plan, from the one where clearing pays the most on (empty when none pays).

    Clearing an old output re-bills everything after it: when the oldest outputs cost more to clear
    than they free, clearing only the newer ones may still pay. `value(freed, j)` is the net saving
    of freeing `freed` tokens from output message `j` on; with no caching, all of the plan pays most.
    """
    planned = plan.indices(visible, digests)
    outputs = [j for j in draft.where if j >= 0]  # output index per visible message
    clients = draft.visible()  # client index per visible message
    pointing = _pointing_into(draft)
    count = draft.counter.count_message
    least = max(1, rules.clear_at_least)
    best, best_value, freed, grown, best_freed = len(planned), 0.0, 0, 0, 0
    cleared: set[int] = set()
    for k in range(len(planned) - 1, -1, -1):
        message = visible[planned[k]]
        source = clients[planned[k]]
        cleared.add(source)
        freed += count(message) - count({**message, "content": PLACEHOLDER})
        grown += _regrowth(draft, pointing, source, cleared)
        if freed >= least and (net := value(freed, outputs[planned[k]], grown)) > best_value:
            best, best_value, best_freed = k, net, freed
    if best == 0:
        return plan
    return ClearPlan(tuple(ids_at(digests, planned[best:])), best_freed)


def _pointing_into(draft: Draft) -> dict[int, list[int]]:
    """For each output a compaction or a deduplicated output points at, the outputs pointing there (client
    indices)."""
    pointing: dict[int, list[int]] = {}
    for i, decision in enumerate(draft.journal.decisions):
        if decision.kind == COMPACTED:
            for source in sources_of(decode(decision.reference)):
                pointing.setdefault(source, []).append(i)
        elif decision.kind == DEDUPED:
            pointing.setdefault(decision.target, []).append(i)
    return pointing


def _regrowth(draft: Draft, pointing: dict[int, list[int]], source: int, cleared: set[int]) -> int:
    """Tokens the outputs pointing at `source` grow back by once it is cleared (those cleared with it aside): a
    duplicate gets its body back (`dedup._release_dangling`), a compaction's lines there stand in it again
    (`Compaction.edit` makes it again; a line a third output holds too may then point there, not counted here)."""
    journal, grown = draft.journal, 0
    for i in pointing.get(source, ()):
        if i in cleared:
            continue
        decision = journal.decisions[i]
        kept = [run for run in decode(decision.reference) if run.source != source] if decision.kind == COMPACTED else []
        standing = (
            Compaction().emit(draft, i, Decision(COMPACTED, reference=encode(kept))) if kept else draft.messages[i]
        )
        grown += draft.counter.count_message(standing) - journal.sent[i]
    return grown


def _spare_in_use(
    draft: Draft, plan: ClearPlan, visible: list[Message], digests: list[bytes], rules: ClearPolicy
) -> ClearPlan:
    """The plan less the outputs the agent is still quoting (`recall.outputs_in_use`), newest first, up to
    `in_use_tokens` of them and never so many that the rest frees under `clear_at_least`; where the rest no
    longer pays, `Clearing.plan` clears the plan whole: sparing never stops an epoch that would have run."""
    if not plan.ids or rules.in_use_turns <= 0 or rules.in_use_tokens <= 0:
        return plan
    outputs = [i for i, m in enumerate(visible) if is_tool_output(m, draft.observations)]
    planned = plan.indices(visible, digests)
    in_use = outputs_in_use(visible, outputs, rules.in_use_turns).intersection(planned)
    if not in_use:
        return plan
    count = draft.counter.count_message
    freed, budget, spared = plan.tokens, rules.in_use_tokens, set()
    for i in sorted(in_use, reverse=True):
        saving = count(visible[i]) - count({**visible[i], "content": PLACEHOLDER})
        if saving > budget or freed - saving < rules.clear_at_least:
            continue
        spared.add(i)
        freed -= saving
        budget -= saving
    if not spared:
        return plan
    return ClearPlan(tuple(ids_at(digests, [i for i in planned if i not in spared])), freed)


def _frontier(draft: Draft, out: list[Message]) -> int:
    """The output index of the oldest tool output still sent with at least `FRONTIER_MIN_CHARS` characters
    (`len(out)` when none): a marked cache reads the prefix before it, and the dialect marks it there."""
    for i, j in enumerate(draft.where):
        if j >= 0 and draft.journal.outputs[i]:
            text = content_text(out[j])
            if text is not None and not is_cleared(text) and len(text) >= FRONTIER_MIN_CHARS:
                return j
    return len(out)


def _rules(draft: Draft) -> tuple[ClearPolicy, int]:
    """The policy's clearing rules as this turn applies them, and the tool output they keep, newest first:
    `keep_tokens` (grown by recall misses) and at least the outputs among the last `RECENT_MESSAGES`. For an agent
    whose finished sessions rarely reached past the newest output (`reach.Reach.trusts_newest`), while this
    session has missed nothing: the newest output alone, clearing outputs down to `TRUSTED_KEEP_UNDER` in epochs
    from `TRUSTED_CLEAR_AT_LEAST`, no sparing of what it quoted lately. Close to clearing every output but the
    newest, which loses that agent about the share its history reached back for."""
    rules = draft.policy.clear_tool_outputs
    if draft.lifetimes.reach.trusts_newest() and draft.journal.recall.heat <= 0:
        trusted = replace(
            rules,
            clear_at_least=min(rules.clear_at_least, TRUSTED_CLEAR_AT_LEAST),
            keep_under=min(rules.keep_under, TRUSTED_KEEP_UNDER),
            in_use_turns=0,
        )
        return trusted, _recent_output_tokens(draft, outputs=1)
    return rules, max(_kept_after_misses(draft), _recent_output_tokens(draft))


def _kept_after_misses(draft: Draft) -> int:
    """`keep_tokens`, doubled for each recall miss of the session as it fades (`RecallIndex.heat`), up to
    `miss_keep_tokens`: an agent reaching for what was cleared works with more output than the policy keeps.

    Measured (`python -m bench quality`, 128k, d = 1) on samples A and B, 24 mini-swe-agent runs not otherwise
    used: the lost rate falls from 0.051 to 0.036 for +0.013 of billed input; the packaged traces lose the same.
    """
    rules = draft.policy.clear_tool_outputs
    heat = draft.journal.recall.heat
    if heat <= 0 or rules.miss_keep_tokens <= rules.keep_tokens:
        return rules.keep_tokens
    return min(rules.miss_keep_tokens, int(rules.keep_tokens * 2**heat))  # heat > 0: never under keep_tokens


def _recent_output_tokens(draft: Draft, outputs: int = RECENT_MESSAGES) -> int:
    """Tokens of the tool outputs among the last `RECENT_MESSAGES` sent (and at most `outputs` of them): the agent
    is working with them."""
    journal, seen, found, tokens = draft.journal, 0, 0, 0
    for i in range(len(journal) - 1, -1, -1):
        if journal.decisions[i].kind == DROPPED:
            continue
        if journal.outputs[i] and journal.decisions[i].kind != CLEARED:
            tokens += journal.sent[i]
            found += 1
        seen += 1
        if seen == RECENT_MESSAGES or found == outputs:
            break
    return tokens


def _clearing_bound(draft: Draft, keep_tokens: int) -> tuple[int, int] | None:
    """An upper bound on what clearing frees, and the newest output it could clear, from the journal's counts."""
    journal = draft.journal
    kept, boundary = 0, -1
    for i in range(len(journal) - 1, -1, -1):
        if journal.outputs[i] and journal.decisions[i].kind not in (CLEARED, DROPPED):
            kept += journal.sent[i]
            if kept > keep_tokens:
                boundary = i
                break
    if boundary < 0:
        return None
    last = newest(draft.messages)
    freed = sum(
        journal.sent[i]
        for i in range(boundary + 1)
        if journal.outputs[i]
        and (journal.decisions[i] is AS_SENT or journal.decisions[i].kind == COMPACTED)
        and i != last
    )
    return freed, boundary
