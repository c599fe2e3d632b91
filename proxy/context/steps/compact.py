"""Compaction: a tool output's lines that already stand in the request point at where they stand (`compact.py`).

It is done while the output is still at the uncached end of the request, so the cache never pays
for it twice: a new output that is not the last message is compacted as it arrives (nothing of it
is cached yet); the last one reaches the upstream as the client sent it, and on the next turn its
compacted form stands in when that pays (it re-bills that one message; `economics.within_budget`).
An epoch compacts what it re-bills anyway, and a compaction whose lines no longer stand where it
points (that output was cleared, cut or dropped) is made again against what does.
"""

from __future__ import annotations

from proxy.context.compact import MAX_INDEX_BYTES, Places, StandingIndex, apply, decode, encode, sources_of
from proxy.context.draft import Draft
from proxy.context.economics import epoch_saving, expected_turns_to_come, within_budget
from proxy.context.journal import AS_SENT, COMPACTED, DEDUPED, Decision, TurnReport
from proxy.context.messages import Message, newest
from proxy.context.steps.base import Epoch

# A compaction freeing fewer tokens than this is not worth a decision.
MIN_FREED = 16


class Compaction:
    kind = COMPACTED

    def __init__(self) -> None:
        self._emitted: dict[tuple[int, str], Message] = {}  # one request's renders: each compaction applied once
        self._before_arrival = Places()  # the outputs before the latest new one, as they stand (one request's)
        self._indexed = 0  # messages before this index are in _before_arrival
        self._targets: set[int] | None = None  # the request's dedup targets, as the first arrival found them

    def emit(self, draft: Draft, i: int, decision: Decision) -> Message:
        key = (i, decision.reference)
        message = self._emitted.get(key)
        if message is None:
            original = draft.messages[i]
            runs = decode(decision.reference)
            labels = {j: _label(draft, j, i) for j in sources_of(runs)}
            message = self._emitted[key] = {**original, "content": apply(original["content"], runs, labels)}
        return message

    def arrived(self, draft: Draft, i: int) -> bool:
        """Compact new output `i` (not the last message: nothing of it is cached yet); True when it was.

        New outputs arrive in order, each decided before the next: the outputs before them are indexed once a
        request, not again for each (a cold turn of N outputs was N² in their lines: issue 29 item 3). Dedup
        targets are found once too: a decision made meanwhile points at an earlier output, never at `i`."""
        if i < self._indexed:  # not in order: start the index again
            self._before_arrival, self._indexed = Places(), 0
        for j in range(self._indexed, i):
            if (text := self.standing(draft, j)) is not None:
                self._before_arrival.add(j, text)
        self._indexed = i
        if self._targets is None:
            self._targets = _dedup_targets(draft)
        if not _candidate(draft, i, self._targets):
            return False
        return self._compact(draft, i, self._before_arrival) is not None

    def after_newest(self, draft: Draft) -> int | None:
        """Compact last request's newest message when that pays; the client index compacted, or None.

        It was sent as the client wrote it and is cached now: its compacted form is billed in full this
        turn (`w × C` instead of `d × V`), and every later turn reads `V - C` fewer tokens from the cache.
        """
        i = draft.first_new - 1
        if i < 0 or i >= newest(draft.messages) or not _candidate(draft, i, _dedup_targets(draft)):
            return None
        journal = draft.journal
        runs = self._standing_before(draft, i).runs(draft.messages[i]["content"])
        if not runs:
            return None
        decision = Decision(COMPACTED, reference=encode(runs))
        before = journal.sent[i]
        after = draft.counter.count_message(self.emit(draft, i, decision))
        freed = before - after
        if freed < MIN_FREED:
            return None
        d, w = draft.discount, draft.model.write_factor
        cost = w * after - d * before
        pays = epoch_saving(d, freed, expected_turns_to_come(draft.replies, draft.lifetimes)) > cost
        assured, direct = draft.assured_turns(), draft.direct_so_far()
        if cost > 0 and not (
            pays
            and within_budget(
                cost, journal.banked, epoch_saving(d, freed, 1.0), 0, 0, assured, direct, draft.policy.bet_overrun
            )
        ):
            return None
        draft.decide(i, decision)
        return i

    def edit(self, draft: Draft, epoch: Epoch, report: TurnReport) -> None:
        """Compact the outputs this epoch re-bills anyway, and make again each compaction pointing at lines gone."""
        if not draft.policy.compact:
            return
        journal, visible = draft.journal, draft.visible()
        start = 0 if epoch.over_budget else draft.first_decided if draft.first_decided is not None else len(journal)
        targets = _dedup_targets(draft)
        places = Places()
        changed: set[int] = set()  # outputs whose lines stand differently now: a pointer into one is stale
        for i in visible:
            decision = journal.decisions[i]
            if decision.kind == COMPACTED:
                sources = sources_of(decode(decision.reference))
                if not sources <= places.texts.keys() or sources & changed:
                    draft.decide(i, AS_SENT)  # what it pointed at is gone or moved: its lines stand here again
                    changed.add(i)
            if i >= start and _candidate(draft, i, targets) and self._compact(draft, i, places) is not None:
                report.compacted += 1
                changed.add(i)
            if (text := self.standing(draft, i)) is not None:
                places.add(i, text)

    def standing(self, draft: Draft, j: int) -> str | None:
        """The text output `j` stands as in the request, to point into: as the client sent it, or compacted
        (its own lines stand there; a run pointing at them is as findable as one pointing at the original)."""
        journal = draft.journal
        if not journal.outputs[j]:
            return None
        decision = journal.decisions[j]
        if decision is AS_SENT:
            return _text(draft.messages[j])
        if decision.kind == COMPACTED:
            emitted = draft.emitted(j)  # its compaction as rendered (kept from last turn while that holds)
            return _text(emitted) if emitted is not None else None
        return None

    def _standing_before(self, draft: Draft, i: int) -> Places:
        """Where the lines of output `i` stand in the outputs before it, as they are sent (`standing`): from the
        session's `StandingIndex`, which this turn extends to `i` (or makes anew where it no longer holds)."""
        journal = draft.journal
        index = journal.standing
        if index is None or index.upto > i or not index.leads(journal.digests, journal.decisions):
            index = StandingIndex()
        index.extend(journal.digests, journal.decisions, [self.standing(draft, j) for j in range(index.upto, i)])
        journal.standing = index if index.held <= MAX_INDEX_BYTES else None
        return index.places_of(set(draft.messages[i]["content"].split("\n")), lambda j: self.standing(draft, j))

    def _compact(self, draft: Draft, i: int, places: Places) -> Decision | None:
        runs = places.runs(draft.messages[i]["content"])
        if not runs:
            return None
        decision = Decision(COMPACTED, reference=encode(runs))
        if draft.journal.sent[i] - draft.counter.count_message(self.emit(draft, i, decision)) < MIN_FREED:
            return None
        draft.decide(i, decision)
        return decision


def _text(message: Message) -> str | None:
    content = message.get("content")
    return content if isinstance(content, str) else None


def _candidate(draft: Draft, i: int, dedup_targets: set[int]) -> bool:
    """An output sent as the client wrote it, not the newest message, with plain text, no reference pointing at it."""
    journal = draft.journal
    return (
        draft.policy.compact
        and i < newest(draft.messages)
        and journal.outputs[i]
        and journal.decisions[i] is AS_SENT
        and i not in dedup_targets
        and _text(draft.messages[i]) is not None
    )


def _dedup_targets(draft: Draft) -> set[int]:
    return {d.target for d in draft.journal.decisions if d.kind == DEDUPED}


def _label(draft: Draft, source: int, at: int) -> str:
    """How a pointer in output `at` names output `source`: by its call id, else by how many outputs back it is."""
    call = draft.messages[source].get("tool_call_id")
    if call and not any(m.get("tool_call_id") == call for m in draft.messages[source + 1 : at]):
        return f"the output of call {call} above"  # the nearest above by that id (a client may reuse one)
    back = sum(draft.journal.outputs[source:at])
    return "the previous output" if back == 1 else f"the output {back} outputs above"
