"""Lossless compaction of a tool output: lines that already stand in the request point to where they stand.

Agents re-read the files they work on and re-run the same tests: an output often repeats runs of
lines an earlier output still sent word for word holds. Each such run becomes one line naming the
earlier output and its line numbers; a run the output itself already holds higher up (a traceback
printed twice, one frame per recursion) names its own lines; a line repeated back to back is kept once
with its count. Every
line the agent saw stays findable in the request. A compaction is a list of `Run`s, small enough
for the journal: applying it to the client's own message is cheap and gives the same bytes every turn.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# A run of fewer lines, or fewer characters, than these costs about as much as the line that points at it.
MIN_RUN_LINES = 2
MIN_RUN_CHARS = 120
# A line shorter than this (stripped) never starts a run (`}`, `</output>`, blank lines match everywhere).
ANCHOR_CHARS = 8
# Per line, the most recent places it stands that a run may start from: bounds the search on long sessions.
MAX_PLACES = 8
REPEATED = -1  # a run's `source` when it repeats the line before it
OWN = -2  # a run's `source` when it repeats lines the same output holds higher up, as sent
OWN_LABEL = "this output"
# What a `StandingIndex` holds in memory, roughly: per line it knows, and per place of a line.
INDEX_LINE_BYTES, INDEX_PLACE_BYTES = 160, 64
# A session's index past this many bytes is not kept from turn to turn (each turn indexes again, as it did before).
MAX_INDEX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Run:
    """Lines `start` to `start + length` of the output: the same as `source`'s lines from `line` on (as that
    output is sent; with `source == OWN`, this output's, higher up), or, with `source == REPEATED`, the line
    before `start` again, `length` times."""

    start: int
    length: int
    source: int  # the client index of the output the lines stand in, or REPEATED
    line: int = 0

    def encode(self) -> str:
        return (
            f"{self.start}+{self.length}"
            if self.source == REPEATED
            else f"{self.start}+{self.length}@{self.source}.{self.line}"
        )


def encode(runs: Sequence[Run]) -> str:
    """The journal's form of a compaction (`Decision.reference`)."""
    return ",".join(run.encode() for run in runs)


def decode(text: str) -> list[Run]:
    runs = []
    for part in text.split(","):
        span, _, at = part.partition("@")
        start, length = (int(x) for x in span.split("+"))
        if at:
            source, line = (int(x) for x in at.split("."))
            runs.append(Run(start, length, source, line))
        else:
            runs.append(Run(start, length, REPEATED))
    return runs


class Places:
    """Where each line of the sources stands, as sources are added in order (client index, text)."""

    def __init__(self, wanted: set[str] | None = None) -> None:
        self.places: dict[str, list[tuple[int, int]]] = {}
        self.texts: dict[int, list[str]] = {}
        self.wanted = wanted  # the lines of the one text to compact, when only one is: the rest is never looked up

    def add(self, source: int, text: str) -> None:
        lines = self.texts[source] = text.split("\n")
        wanted = self.wanted
        for k, line in enumerate(lines):
            if (wanted is None or line in wanted) and len(line.strip()) >= ANCHOR_CHARS:
                found = self.places.setdefault(line, [])
                found.append((source, k))
                if len(found) > MAX_PLACES:
                    del found[0]

    def runs(self, text: str) -> list[Run]:
        """The runs of `text` to point at instead of sending: lines standing in a source or higher up in `text`
        itself (sent as they are), longest first at each line, the newest source on a tie; then lines
        repeated back to back."""
        lines = text.split("\n")
        own = _Own()
        runs: list[Run] = []
        p, n = 0, len(lines)
        while p < n:
            best = self._longest(lines, p)
            mine = own.longest(lines, p)
            if mine is not None and (best is None or mine.length > best.length):
                best = mine
            if best is not None and best.length >= MIN_RUN_LINES and _chars(lines, best) >= MIN_RUN_CHARS:
                runs.append(best)
                own.pointer()
                p += best.length
                continue
            repeats = 0
            while p + 1 + repeats < n and lines[p + 1 + repeats] == lines[p] and len(lines[p].strip()) >= ANCHOR_CHARS:
                repeats += 1
            if repeats >= MIN_RUN_LINES:
                runs.append(Run(p + 1, repeats, REPEATED))
                own.kept(lines, p)
                own.pointer()
                p += 1 + repeats
                continue
            own.kept(lines, p)
            p += 1
        return runs

    def _longest(self, lines: list[str], p: int) -> Run | None:
        best: Run | None = None
        n = len(lines)
        for source, k in self.places.get(lines[p], ()):
            theirs = self.texts[source]
            length = 1
            while p + length < n and k + length < len(theirs) and lines[p + length] == theirs[k + length]:
                length += 1
            if best is None or length >= best.length:
                best = Run(p, length, source, k)
        return best


class _Own:
    """The lines of the output being compacted that it sends as they are, so far: where a later run of its own
    lines may point. Lines sent as they are stand next to each other in what is sent between two pointers."""

    def __init__(self) -> None:
        self.places: dict[str, list[int]] = {}  # line -> its positions in the client's text, kept as sent
        self.sent: dict[int, int] = {}  # position in the client's text -> line number in what is sent
        self.next = 0  # the line number in what is sent of the next line

    def kept(self, lines: list[str], p: int) -> None:
        """Line `p` is sent as it is."""
        if len(lines[p].strip()) >= ANCHOR_CHARS:
            found = self.places.setdefault(lines[p], [])
            found.append(p)
            if len(found) > MAX_PLACES:
                del found[0]
        self.sent[p] = self.next
        self.next += 1

    def pointer(self) -> None:
        """A pointer line is sent next."""
        self.next += 1

    def longest(self, lines: list[str], p: int) -> Run | None:
        """The longest run from line `p` on that stands higher up as sent: lines before `p`, each sent as it is
        and next to the one before it in what is sent."""
        best: Run | None = None
        n, sent = len(lines), self.sent
        for k in self.places.get(lines[p], ()):
            length = 1
            while (
                p + length < n
                and k + length < p
                and sent.get(k + length) == sent[k] + length
                and lines[p + length] == lines[k + length]
            ):
                length += 1
            if best is None or length >= best.length:
                best = Run(p, length, OWN, sent[k])
        return best


def _chars(lines: list[str], run: Run) -> int:
    return sum(len(line) + 1 for line in lines[run.start : run.start + run.length])


def apply(text: str, runs: Sequence[Run], labels: dict[int, str]) -> str:
    """`text` with each run replaced by the line that points at it; `labels[source]` names each source."""
    lines = text.split("\n")
    out: list[str] = []
    p = 0
    for run in runs:
        out.extend(lines[p : run.start])
        if run.source == REPEATED:
            out.append(f"[previous line repeated {run.length} more times]")
        else:
            last, label = run.line + run.length, OWN_LABEL if run.source == OWN else labels[run.source]
            out.append(f"[{run.length} lines here are lines {run.line + 1}-{last} of {label}, unchanged]")
        p = run.start + run.length
    out.extend(lines[p:])
    return "\n".join(out)


def sources_of(runs: Sequence[Run]) -> set[int]:
    """The client indices of the outputs a compaction points into."""
    return {run.source for run in runs if run.source >= 0}


class _Lines(dict[int, list[str]]):
    """Each source's lines, split when first asked for: a run looks into few of the sources it could."""

    def __init__(self, text_of: Callable[[int], str | None]) -> None:
        super().__init__()
        self.text_of = text_of

    def __missing__(self, source: int) -> list[str]:
        lines = self[source] = (self.text_of(source) or "").split("\n")
        return lines


@dataclass
class StandingIndex:
    """Where each line a run may start from stands in a session's outputs before client message `upto`, as those
    outputs stood when indexed, with the journal's digests and decisions they were indexed under.

    A turn compacts last request's newest output against every output before it; their lines do not change while
    those messages and their decisions lead the journal, so the index is kept from turn to turn in this process
    (`Journal.standing`, never stored) and a turn adds only the outputs new since. It only grows: a journal that
    no longer leads with what it was built from (an epoch's decisions, a cut, an edited history) gets a new one."""

    places: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    digests: list[bytes] = field(default_factory=list)
    decisions: list[object] = field(default_factory=list)
    held: int = 0

    @property
    def upto(self) -> int:
        return len(self.digests)

    def leads(self, digests: Sequence[bytes], decisions: Sequence[object]) -> bool:
        """Whether the messages and decisions it was built from still lead these (its decisions the very objects)."""
        n = self.upto
        return (
            len(digests) >= n and digests[:n] == self.digests and all(map(operator.is_, self.decisions, decisions[:n]))
        )

    def extend(self, digests: Sequence[bytes], decisions: Sequence[object], texts: Sequence[str | None]) -> None:
        """Index the messages from `upto` on: `texts[k]` is what message `upto + k` stands as (None: no output)."""
        start, places = self.upto, self.places
        for k, text in enumerate(texts):
            if text is None:
                continue
            source = start + k
            for line_number, line in enumerate(text.split("\n")):
                if len(line.strip()) < ANCHOR_CHARS:
                    continue
                found = places.get(line)
                if found is None:
                    found = places[line] = []
                    self.held += INDEX_LINE_BYTES + len(line)
                found.append((source, line_number))
                if len(found) > MAX_PLACES:
                    del found[0]
                else:
                    self.held += INDEX_PLACE_BYTES
        self.digests.extend(digests[start : start + len(texts)])
        self.decisions.extend(decisions[start : start + len(texts)])

    def places_of(self, wanted: set[str], text_of: Callable[[int], str | None]) -> Places:
        """The places of the `wanted` lines, as `Places(wanted)` with every indexed source added would hold them;
        `text_of(source)` is what a source stands as now (the index keeps no text: while it leads the journal, each
        stands as it did when indexed)."""
        view = Places(wanted)
        view.texts = _Lines(text_of)
        index = self.places
        view.places = {line: index[line] for line in wanted if line in index}  # read, never changed, by `runs`
        return view
