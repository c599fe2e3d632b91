"""One request being drafted: the client's messages, the journal being edited, and what they render to.

Each edit kind (`proxy.context.steps`) owns what it emits for a message it decided; the
draft replays every decision in order, places injections and omission notes, and keeps
which output message renders which client message.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from proxy.context.economics import billed_input, epoch_cost, epoch_saving, epoch_value, within_budget
from proxy.context.fitting import omission_note
from proxy.context.journal import (
    AS_SENT,
    CLEARED,
    COMPACTED,
    CONTENT_BYTES,
    DEDUPED,
    KEEP,
    Decision,
    EditedContents,
    Injection,
    Journal,
)
from proxy.context.messages import Message, content_bytes, message_digest
from proxy.context.patterns import Pattern
from proxy.context.policy import ModelInfo, Policy
from proxy.context.survival import NO_HISTORY, Lifetimes
from proxy.context.tokens import REPLY_PRIMING, Counter

# What an edit kind sends for client message `i` under its decision (None: nothing, the message is dropped).
Emitter = Callable[["Draft", int, Decision], "Message | None"]
# The kinds whose emitter sends `{**message, "content": c}`, `c` made from the message and those before it alone:
# their contents are kept from turn to turn (`EditedContents`). A cut's come from the `CutCache`.
KEPT_CONTENTS = frozenset({CLEARED, COMPACTED, DEDUPED})


@dataclass
class Draft:
    """One request's inputs and the journal being edited."""

    messages: list[Message]
    journal: Journal
    policy: Policy
    model: ModelInfo
    counter: Counter
    usable: int  # the window less the completion's reserve
    fixed: int  # the tools schema and the reply priming
    correction: float
    emitters: dict[str, Emitter]  # decision kind -> what it sends
    observations: tuple[Pattern, ...] = ()
    first_new: int = 0  # messages before this index were in last turn's request
    where: list[int] = field(default_factory=list)  # output index per client message, -1 when dropped
    first_decided: int | None = None  # the earliest client message given a new decision while drafting
    # The upstream's cache has expired since the session's last request (the shell's clock says so): this
    # request is written in full whatever we send, so an edit re-bills nothing and any edit that frees pays.
    cold: bool = False
    held_back: int = 0  # tokens a clearing could free this turn (at most) that it does not free: it does not pay yet
    # The client's request does not fit the usable window: sent as written, the upstream would refuse it, so it
    # has no direct bill to save against (`direct_so_far`, the session's bank). Set by the pipeline once a turn.
    over_window: bool = False
    # How long the agent's finished sessions lasted: what an edit's turns to come are priced by (`economics`).
    lifetimes: Lifetimes = NO_HISTORY
    # The last turn's edited contents, good for client messages before `reusable` (`EditedContents.reusable`),
    # and this request's, by client index: what `emitted` sent under which decision.
    carried: EditedContents | None = None
    reusable: int = 0
    contents: dict[int, tuple[Decision, object]] = field(default_factory=dict)

    @property
    def discount(self) -> float:
        """The price of the tokens this request shares with the last, as a share of the input price: the
        model's cached price, or the write price when the cache is cold."""
        return self.model.write_factor if self.cold else self.model.cache_discount

    def total(self, counts: Sequence[int]) -> int:
        """The request's tokens as the upstream will count them: messages, the fixed part, our correction."""
        return math.ceil((sum(counts) + self.fixed) * self.correction)

    def direct_bill(self) -> float:
        """This request's input, sent as the client wrote it, in full-price tokens: cached up to what it
        shares with the client's last request, the new messages at the write price."""
        tokens = self.journal.tokens
        new = sum(tokens[self.first_new :])
        return billed_input(self.discount, self.model.write_factor, sum(tokens) - new, new)

    @functools.cached_property
    def replies(self) -> int:
        """The assistant messages in the request: the turns the session has had before this one (counted once a
        request: the messages do not change while it is drafted)."""
        return sum(1 for m in self.messages if m.get("role") == "assistant")

    def assured_turns(self) -> int:
        """Turns after this one that all but `survival.RISK` of the agent's sessions this long outlasted."""
        return self.lifetimes.assured_turns(self.replies + 1)

    def direct_so_far(self) -> float:
        """What the client's requests would have billed so far, this one's included: what a bet is read against."""
        return self.journal.direct + (0.0 if self.over_window else self.direct_bill())

    def new_at(self, length: int) -> int:
        """The output index of the first message new this turn (`length`, the output's, when none is)."""
        return next((j for j in self.where[self.first_new :] if j >= 0), length)

    def position(self, counts: Sequence[int], j: int) -> int:
        """The token position where output message `j` starts in the request (the tools schema comes first)."""
        return self.fixed - REPLY_PRIMING + sum(counts[:j])

    def cached_end(self, counts: Sequence[int]) -> int:
        """Where what the cache held ends, an edit's re-billed part with it: the turn's new messages are billed in
        full with or without an edit, so where they start (a marked cache reads no further than its frontier, which
        an edit rewrites from: the whole request)."""
        return self.total(counts) if self.model.marked_cache else self.position(counts, self.new_at(len(counts)))

    def edit_value(self) -> Callable[..., float]:
        """The epoch rule with this session's figures: `value(freed, first, end, grown=0)` is the net saving expected
        of an edit freeing `freed` tokens from token `first` on, the re-billed part ending at `end` once it is made
        and `grown` tokens standing whole again through it (a compaction pointing into what it clears), or -1 when
        it costs more this turn than `economics.within_budget` allows with the session's bank, the first turn's
        bill while no edit was made, its agent's history and its direct bill so far."""
        d, w, turns, lifetimes = self.discount, self.model.write_factor, self.replies, self.lifetimes
        banked, risk_turns, behind = self.journal.banked, self.policy.first_edit_risk_turns, self.policy.bet_overrun
        first_turn = 0.0 if self.journal.epochs else self.direct_bill()  # what a first edit may bet a share of
        assured, direct = self.assured_turns(), self.direct_so_far()

        def value(freed: int, first: int, end: int, grown: int = 0) -> float:
            net = freed - grown
            cost, per_turn = epoch_cost(d, end + grown, first, net, w), epoch_saving(d, net, 1.0)
            if not within_budget(cost, banked, per_turn, first_turn, risk_turns, assured, direct, behind):
                return -1.0
            return epoch_value(
                discount=d,
                tokens_after=end,
                first_changed=first,
                freed=freed,
                turns_so_far=turns,
                write=w,
                lifetimes=lifetimes,
            )

        return value

    def emitted(self, i: int) -> Message | None:
        """What the journal's decision sends for client message `i` (None when dropped); an edited content made
        under the same decision this request or (for a message as it was) last turn is taken again."""
        decision = self.journal.decisions[i]
        if decision.kind == KEEP:
            return self.messages[i]
        if decision.kind not in KEPT_CONTENTS:
            return self.emitters[decision.kind](self, i, decision)
        known = self.contents.get(i)
        if known is None and i < self.reusable and self.carried is not None:
            known = self.carried.contents.get(i)
        if known is not None and (known[0] is decision or known[0] == decision):
            self.contents[i] = known
            return {**self.messages[i], "content": known[1]}
        message = self.emitters[decision.kind](self, i, decision)
        if message is not None:
            self.contents[i] = (decision, message.get("content"))
        return message

    def carry(self) -> EditedContents | None:
        """This request's edited contents under the journal's final decisions, for the next turn (None: none)."""
        decisions = self.journal.decisions
        kept = {i: known for i, known in self.contents.items() if i < len(decisions) and known[0] == decisions[i]}
        if not kept:
            return None
        journal = self.journal
        held = 16 * len(journal.digests) + sum(CONTENT_BYTES + content_bytes(c) for _, c in kept.values())
        return EditedContents(list(journal.digests), list(journal.outputs), kept, held)

    def render(self) -> tuple[list[Message], list[int]]:
        """The output messages and their counts: decisions replayed, injections and omission notes in place."""
        out: list[Message] = []
        counts: list[int] = []
        where: list[int] = []
        anchored: dict[int, list[Injection]] = {}
        for injection in self.journal.injections:
            anchored.setdefault(injection.anchor, []).append(injection)
        decisions, sent = self.journal.decisions, self.journal.sent
        note_at, run = -1, 0
        # Runs every turn over the whole conversation: a message kept as sent takes the short path.
        for i, message in enumerate(self.messages):
            if anchored and i in anchored:
                for injection in anchored[i]:
                    out.append(injection.message())
                    counts.append(self.counter.count_message(out[-1]))
            emitted = message if decisions[i] is AS_SENT else self.emitted(i)
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

    def sources(self, length: int) -> list[int]:
        """For each of the last render's `length` outputs, the client message it renders (-1: inserted)."""
        sources = [-1] * length
        for i, j in enumerate(self.where):
            if j >= 0:
                sources[j] = i
        return sources

    def decide(self, i: int, decision: Decision) -> None:
        """Record a new decision for message `i`, with the tokens it now sends."""
        self.journal.decide(i, decision)
        self.first_decided = i if self.first_decided is None else min(i, self.first_decided)
        emitted = self.emitted(i)
        self.journal.sent[i] = 0 if emitted is None else self.counter.count_message(emitted)

    def visible(self) -> list[int]:
        """The client messages the last render still sends (in some form)."""
        return [i for i, j in enumerate(self.where) if j >= 0]

    def visible_output(self, out: list[Message]) -> tuple[list[Message], list[bytes]]:
        """What is sent for the client's messages still present, and its digests.

        A message sent as the client wrote it has the digest the journal already holds: only edited ones are hashed.
        """
        visible, digests = [], []
        for i, j in enumerate(self.where):
            if j >= 0:
                sent = out[j]
                visible.append(sent)
                digests.append(self.journal.digests[i] if sent is self.messages[i] else message_digest(sent))
        return visible, digests

    def output_index(self, visible_index: int) -> int:
        """The output position of the `visible_index`-th message still present."""
        return [j for j in self.where if j >= 0][visible_index]
