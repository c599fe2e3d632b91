"""Seed `ContextRequest`: pick the context capsules worth injecting for a query, within a budget.

Scoring is lexical (BM25, normalised to [0, 1]) so it needs no model and gives the
same answer every turn: a capsule injected once stays injected while the query agrees.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter as Tally
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from proxy.context.tokens import Counter, HeuristicCounter

# BM25's usual constants: term-frequency saturation and length normalisation.
BM25_K1 = 1.2
BM25_B = 0.75
# The base score blends relevance with the author's confidence in the capsule;
# freshness and scope then scale it (1.0 each when not given).
RELEVANCE_WEIGHT = 0.7
CONFIDENCE_WEIGHT = 0.3
TAG_BOOST = 1.4
ROLE_BOOST = 1.3

_WORD = re.compile(r"[a-z0-9_]+")
_SPACE = re.compile(r"\s")
# Characters lowered, scanned and counted per call: one call holds the GIL however long it runs, so a 20 MB
# capsule counted in one (3-4 s) held the event loop while an engine thread did it (issue 29 item 13).
_SLICE = 16 * 1024


@dataclass
class ContextRequest:
    """What the turn needs: the query, the token budget and the filters and boosts of the seed."""

    query: str
    budget_tokens: int
    stage: str = ""  # carried for callers and reports; not scored
    tags: list[str] = field(default_factory=list)
    min_score: float = 0.0
    max_capsules: int = 0
    prefer_roles: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)


@dataclass
class Capsule:
    """A piece of context a session's config offers for injection.

    What scoring and counting need from its text is worked out once per capsule and kept on it, so a
    caller that keeps its capsules across turns (the service does, per config) pays for a big one once.
    """

    id: str
    kind: str
    text: str
    tags: list[str] = field(default_factory=list)
    confidence: float = 1.0
    freshness: float = 1.0
    scope_weight: float = 1.0

    @cached_property
    def terms(self) -> Tally[str]:
        """Its words (text, kind and tags) and how often each comes: what BM25 scores."""
        terms = Tally[str]()
        for piece in _slices(self.text):
            terms.update(_words(piece))
        terms.update(_words(f" {self.kind} {' '.join(self.tags)}"))
        return terms

    @cached_property
    def length(self) -> int:
        return sum(self.terms.values())

    @cached_property
    def haystack(self) -> str:
        """Where a request's tags are looked for: its text and kind, lower case."""
        return "".join(piece.lower() for piece in _slices(f"{self.text}\n{self.kind}"))

    @cached_property
    def text_key(self) -> str:
        """A short digest of its text: a changed capsule is a different one."""
        return hashlib.blake2b(self.text.encode(), digest_size=8).hexdigest()

    def tokens(self, counter: Counter) -> int:
        """Its text's tokens by `counter`, counted once per kind of counter (an encoding's, the heuristic)."""
        counts: dict[str, int] = self.__dict__.setdefault("_tokens", {})
        kind = f"{type(counter).__name__}:{getattr(counter, 'name', '')}"
        if kind not in counts:
            counts[kind] = counter.count_text(self.text)
        return counts[kind]


@dataclass
class ContextBundle:
    """The capsules chosen, in score order, and why the others were not."""

    capsules: list[Capsule] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)  # ids scored but not chosen, in score order
    skipped: bool = False  # min_score was set and no capsule reached it: nothing injected
    used_tokens: int = 0
    top_score: float = 0.0


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _slices(text: str) -> Iterator[str]:
    """`text` in pieces of about _SLICE characters, each cut at a space: no word is split, nor lowered apart."""
    start = 0
    while start < len(text):
        cut = _SPACE.search(text, start + _SLICE)
        end = cut.start() if cut else len(text)
        yield text[start:end]
        start = end


def _relevance(query: str, documents: Sequence[Capsule]) -> list[float]:
    """BM25 of each capsule for the query, divided by its ceiling so 1.0 means every term, saturated."""
    terms = set(_words(query))
    if not terms or not documents:
        return [0.0] * len(documents)
    n = len(documents)
    average = sum(d.length for d in documents) / n or 1.0
    frequency = {t: sum(1 for d in documents if t in d.terms) for t in terms}
    idf = {t: math.log(1 + (n - frequency[t] + 0.5) / (frequency[t] + 0.5)) for t in terms}
    ceiling = sum(idf.values()) * (BM25_K1 + 1)
    scores = []
    for document in documents:
        counts = document.terms
        norm = BM25_K1 * (1 - BM25_B + BM25_B * document.length / average)
        score = sum(idf[t] * counts[t] * (BM25_K1 + 1) / (counts[t] + norm) for t in terms if counts[t])
        scores.append(min(1.0, score / ceiling))
    return scores


def _score(capsule: Capsule, relevance: float, request: ContextRequest) -> float:
    score = (RELEVANCE_WEIGHT * relevance + CONFIDENCE_WEIGHT * capsule.confidence) * capsule.freshness
    score *= capsule.scope_weight
    haystack = capsule.haystack
    own_tags = {t.lower() for t in capsule.tags}
    if any(t and (t.lower() in haystack or t.lower() in own_tags) for t in request.tags):
        score *= TAG_BOOST
    if capsule.kind.lower() in {r.lower() for r in request.prefer_roles}:
        score *= ROLE_BOOST
    return score


def select_capsules(
    request: ContextRequest, capsules: Sequence[Capsule], counter: Counter | None = None
) -> ContextBundle:
    """Filter by kind, score, then fill the budget greedily by score (ties by id), at most `max_capsules`."""
    counter = counter if counter is not None else HeuristicCounter()
    kinds = {k.lower() for k in request.kinds}
    candidates = [c for c in capsules if not kinds or c.kind.lower() in kinds]
    scored = sorted(
        ((_score(c, r, request), c) for c, r in zip(candidates, _relevance(request.query, candidates), strict=True)),
        key=lambda pair: (-pair[0], pair[1].id),
    )
    top = scored[0][0] if scored else 0.0
    if request.min_score > 0 and top < request.min_score:
        return ContextBundle(excluded=[c.id for _, c in scored], skipped=True, top_score=top)
    bundle = ContextBundle(top_score=top)
    for score, capsule in scored:
        tokens = capsule.tokens(counter)
        full = request.max_capsules and len(bundle.capsules) >= request.max_capsules
        if full or score < request.min_score or bundle.used_tokens + tokens > request.budget_tokens:
            bundle.excluded.append(capsule.id)
            continue
        bundle.capsules.append(capsule)
        bundle.used_tokens += tokens
    return bundle
