"""A session's journal: what the proxy decided for every message it has forwarded.

Per client message it keeps the digest, the token count, and the decision (kept,
cleared, cut, deduplicated, dropped), never the body: replacements are recomputed
from the client's own message, so memory grows with the number of messages, not
their bytes. Replaying the decisions makes the upstream see last turn's bytes again.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.context.compact import StandingIndex
from proxy.context.diff import ContextBlock, ContextDiff
from proxy.context.recall import RecallIndex

KEEP, CLEARED, CUT, DEDUPED, DROPPED = "keep", "cleared", "cut", "deduped", "dropped"
COMPACTED = "compacted"  # lines that stand elsewhere in the request point there (`proxy.context.compact`)
DIGEST_SIZE = 16
# What a journal holds in this process's memory, roughly (CPython 3.11, measured with tracemalloc by
# tests/test_memory_budget.py): per message its digest, two counts and five list slots; per kept output
# body an entry of `bodies`; per edited decision its object and reference line; per injection its text.
ENTRY_BYTES = 120
BODY_BYTES = 150
DECISION_BYTES = 70
BLOCK_BYTES = 400  # a capsule of the snapshot, or an injection's own object
CONTENT_BYTES = 150  # an edited message's entry in `EditedContents`, beside its content


@dataclass(frozen=True, slots=True)
class Decision:
    """What the proxy emits for one client message."""

    kind: str = KEEP
    max_tokens: int = 0  # cut: the text's allowance, head + marker + tail
    reference: str = ""  # deduped: the line sent instead of the body; compacted: its runs (`compact.encode`);
    # cleared: the lines its stub keeps (`stubs.encode`), "" for the placeholder alone
    target: int = -1  # deduped: the client index of the identical output it points to

    def to_json(self) -> Any:
        if self.kind in (KEEP, CLEARED, DROPPED) and not self.reference:
            return self.kind
        return [self.kind, self.max_tokens, self.reference, self.target]

    @classmethod
    def from_json(cls, value: Any) -> Decision:
        if isinstance(value, str):
            return _SIMPLE[value]
        kind, max_tokens, reference, target = value
        return cls(str(kind), int(max_tokens), str(reference), int(target))


AS_SENT = Decision()  # the decision of a message sent exactly as the client wrote it
_SIMPLE = {KEEP: AS_SENT, CLEARED: Decision(CLEARED), DROPPED: Decision(DROPPED)}


def _weight(decision: Decision) -> int:
    """Bytes a decision adds to its journal: nothing for a simple one (one object shared by all), else its
    object and reference (a dedup line, compacted runs, a stub's kept lines)."""
    return 0 if decision.kind in _SIMPLE and not decision.reference else DECISION_BYTES + len(decision.reference)


@dataclass(frozen=True, slots=True)
class EditedContents:
    """What a turn sent for its edited messages (cleared, compacted, deduplicated: each `{**message, "content": c}`),
    by client index: the decision and the content `c`, with the journal's digests and outputs they were made from.

    An emitted content depends on its message and the messages before it alone, so while those digests and outputs
    still lead the journal, the next turn's render takes `c` again instead of emitting it anew (a compaction's
    lines and labels, a stub's kept lines): on a long edited conversation that was most of a warm turn. Kept in
    this process only (a restored journal emits once); `held` is what it holds in memory.
    """

    digests: list[bytes]
    outputs: list[bool]
    contents: dict[int, tuple[Decision, Any]]
    held: int

    def reusable(self, journal: Journal) -> int:
        """How many leading messages of `journal` these contents hold for: all of theirs, or 0."""
        n = len(self.digests)
        if n > len(journal.digests) or journal.digests[:n] != self.digests or journal.outputs[:n] != self.outputs:
            return 0
        return n


@dataclass(frozen=True)
class Injection:
    """A system message of capsules the proxy placed before client message `anchor`."""

    anchor: int
    capsules: tuple[str, ...]  # "id#texthash" of each capsule it carries
    text: str

    def message(self) -> dict[str, Any]:
        return {"role": "system", "content": self.text}


@dataclass(slots=True)
class TurnReport:
    """What one turn did, for the response headers and `GET /sessions/{id}`."""

    turn: int
    tokens_before: int
    tokens_after: int
    epoch: bool = False
    reasons: tuple[str, ...] = ()
    cleared: int = 0
    removed: int = 0
    cut: int = 0
    deduped: int = 0
    compacted: int = 0  # tool outputs sent with their repeated lines pointing at where they stand
    diff: ContextDiff = field(default_factory=ContextDiff)
    first_changed: int | None = None  # output index of the first message an epoch changed
    recall_missed: int = 0  # tokens the agent's newest message used that only removed content held
    reruns: int = 0  # calls in it whose output the proxy had cleared
    banked: float = 0.0  # billed input tokens the session's edits have saved after this turn, by our counts
    held_back: int = 0  # tokens of tool output a clearing could free (at most) that it did not, not paying yet
    over_window: bool = False  # the client's request did not fit the usable window: sent direct, it is refused

    @property
    def rewrote_prefix(self) -> bool:
        """This turn sent something other than what the upstream cached last turn: an epoch, or last turn's
        newest output compacted (the turns when an edit's cost is paid)."""
        return self.epoch or self.first_changed is not None

    def headers(self) -> dict[str, str]:
        return {
            "X-Context-Tokens-Before": str(self.tokens_before),
            "X-Context-Tokens-After": str(self.tokens_after),
            "X-Context-Diff": self.diff.summary(),
            "X-Context-Epoch": "1" if self.epoch else "0",
        }

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in _REPORT_FIELDS}
        data["reasons"] = list(self.reasons)
        data["diff"] = self.diff.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TurnReport:
        fields_ = {k: data[k] for k in _REPORT_FIELDS if k in data}
        fields_["reasons"] = tuple(data.get("reasons", ()))
        return cls(**fields_, diff=ContextDiff.from_dict(data.get("diff", {})))


_REPORT_FIELDS = (
    "turn",
    "tokens_before",
    "tokens_after",
    "epoch",
    "reasons",
    "cleared",
    "removed",
    "cut",
    "deduped",
    "compacted",
    "first_changed",
    "recall_missed",
    "reruns",
    "banked",
    "held_back",
    "over_window",
)


@dataclass
class Journal:
    """Parallel per-message lists (digest, tokens, tokens sent, tool output?, decision) plus injections."""

    digests: list[bytes] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # the client's message
    sent: list[int] = field(default_factory=list)  # what the proxy emits for it (0 when dropped)
    outputs: list[bool] = field(default_factory=list)  # a tool output (or an observation)
    decisions: list[Decision] = field(default_factory=list)
    bodies: dict[bytes, int] = field(default_factory=dict)  # output body digest -> index of a kept output
    injections: list[Injection] = field(default_factory=list)
    snapshot: list[ContextBlock] = field(default_factory=list)  # the capsules selected last turn
    turn: int = 0
    epochs: int = 0
    # The clearing bound (tokens) at which the last plan did not pay: planning re-measures every
    # output, so no new plan is made until the bound has grown by `clear_at_least` (0 = none).
    unpaid_bound: int = 0
    recall: RecallIndex = field(default_factory=RecallIndex)  # what was removed, for live recall misses
    # Billed input tokens the edits have saved this session so far, by our own counts (negative: they
    # cost more than they saved): what an edit that does not pay at once may spend (`economics.within_budget`).
    # A turn whose request, sent as the client wrote it, the upstream would refuse (over the window) saves nothing
    # against it: what the window forced is no saving a bet may spend (issue 27: Codex at 32k, $0.3305 -> $0.2780).
    banked: float = 0.0
    # Billed input tokens the client's own requests would have cost so far (each turn's `Draft.direct_bill`, but for
    # those over the window): what `banked` is read against, so a bet never leaves the session far behind direct.
    direct: float = 0.0
    # The `_weight` of every decision, kept as decisions change (`decide`), so `approx_bytes` walks nothing.
    edit_bytes: int = 0
    # What the last turn sent for its edited messages, for the next turn's render (not stored: this process's only).
    edited: EditedContents | None = field(default=None, compare=False, repr=False)
    # Where the lines of its outputs stand, for compacting the next newest output (not stored either).
    standing: StandingIndex | None = field(default=None, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.digests)

    def copy(self) -> Journal:
        """An independent journal: `process` edits a copy and never the caller's."""
        return Journal(
            digests=list(self.digests),
            tokens=list(self.tokens),
            sent=list(self.sent),
            outputs=list(self.outputs),
            decisions=list(self.decisions),
            bodies=dict(self.bodies),
            injections=list(self.injections),
            snapshot=list(self.snapshot),
            turn=self.turn,
            epochs=self.epochs,
            unpaid_bound=self.unpaid_bound,
            recall=self.recall.copy(),
            banked=self.banked,
            direct=self.direct,
            edit_bytes=self.edit_bytes,
            edited=self.edited,
            standing=self.standing,
        )

    def approx_bytes(self) -> int:
        """What the journal holds in memory, roughly: a few sums of lengths, no walk over its entries."""
        return (
            ENTRY_BYTES * len(self.digests)
            + BODY_BYTES * len(self.bodies)
            + self.edit_bytes
            + sum(BLOCK_BYTES + len(j.text) for j in self.injections)
            + BLOCK_BYTES * len(self.snapshot)
            + self.recall.approx_bytes()
            + (self.edited.held if self.edited is not None else 0)
            + (self.standing.held if self.standing is not None else 0)
        )

    def decide(self, i: int, decision: Decision) -> None:
        """Message `i` is now sent as `decision` says."""
        self.edit_bytes += _weight(decision) - _weight(self.decisions[i])
        self.decisions[i] = decision

    def align(self, digests: Sequence[bytes]) -> int:
        """Keep the longest prefix matching `digests`, forget the rest; return its length."""
        if self.digests == digests[: len(self.digests)]:  # the usual turn: the client only appended
            return len(self.digests)
        n = 0
        for mine, theirs in zip(self.digests, digests, strict=False):
            if mine != theirs:
                break
            n += 1
        if n < len(self.digests):
            self.cut(n)
        return n

    def cut(self, n: int) -> None:
        """Forget messages from index `n` on, the injections anchored there and what they carried."""
        self.edit_bytes -= sum(_weight(d) for d in self.decisions[n:])
        for name in ("digests", "tokens", "sent", "outputs", "decisions"):
            del getattr(self, name)[n:]
        self.bodies = {body: i for body, i in self.bodies.items() if i < n}
        self.injections = [j for j in self.injections if j.anchor < n]
        present = {key.split("#", 1)[0] for j in self.injections for key in j.capsules}
        self.snapshot = [b for b in self.snapshot if b.anchor in present]
        self.unpaid_bound = 0

    def append(self, digest: bytes, tokens: int, sent: int, output: bool, decision: Decision = AS_SENT) -> None:
        self.digests.append(digest)
        self.tokens.append(tokens)
        self.sent.append(sent)
        self.outputs.append(output)
        self.decisions.append(decision)
        self.edit_bytes += _weight(decision)

    def record(self, report: TurnReport) -> None:
        self.turn = report.turn
        self.epochs += int(report.epoch)

    def summary(self) -> dict[str, Any]:
        """What `/sessions/{id}` shows of the journal: edit epochs so far, the billed tokens the edits have saved
        (`banked`: what an edit that costs more than it frees may stake), and the recall counts."""
        return {"epochs": self.epochs, "banked": round(self.banked, 1), **self.recall.summary()}

    def injected(self) -> set[str]:
        """Keys of the capsules already in the conversation."""
        return {key for j in self.injections for key in j.capsules}

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, for the session store."""
        return {
            "digests": base64.b64encode(b"".join(self.digests)).decode(),
            "tokens": list(self.tokens),
            "sent": list(self.sent),
            "outputs": "".join("1" if o else "0" for o in self.outputs),
            "decisions": [d.to_json() for d in self.decisions],
            "bodies": [[body.hex(), i] for body, i in self.bodies.items()],
            "injections": [[j.anchor, list(j.capsules), j.text] for j in self.injections],
            "snapshot": [b.to_dict() for b in self.snapshot],
            "turn": self.turn,
            "epochs": self.epochs,
            "unpaid_bound": self.unpaid_bound,
            "recall": self.recall.to_dict(),
            "banked": round(self.banked, 1),
            "direct": round(self.direct, 1),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Journal:
        raw = base64.b64decode(data.get("digests", ""))
        journal = cls(
            digests=[raw[i : i + DIGEST_SIZE] for i in range(0, len(raw), DIGEST_SIZE)],
            tokens=[int(t) for t in data.get("tokens", [])],
            sent=[int(t) for t in data.get("sent", [])],
            outputs=[c == "1" for c in data.get("outputs", "")],
            decisions=[Decision.from_json(d) for d in data.get("decisions", [])],
            bodies={bytes.fromhex(body): int(i) for body, i in data.get("bodies", [])},
            injections=[Injection(int(a), tuple(keys), str(text)) for a, keys, text in data.get("injections", [])],
            snapshot=[ContextBlock.from_dict(b) for b in data.get("snapshot", [])],
            turn=int(data.get("turn", 0)),
            epochs=int(data.get("epochs", 0)),
            unpaid_bound=int(data.get("unpaid_bound", 0)),
            recall=RecallIndex.from_dict(data.get("recall", {})),
            banked=float(data.get("banked", 0.0)),
            direct=float(data.get("direct", 0.0)),
        )
        journal.edit_bytes = sum(_weight(d) for d in journal.decisions)
        return journal
