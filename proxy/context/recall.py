"""What the agent uses: the specific tokens of its messages, and which outputs hold them (SPEC §9).

Specific tokens are identifiers and paths of 4 characters or more and numbers of 2 digits or
more, minus common words: the names, files and line numbers an agent reads in a tool output
and writes back in its next call. The quality benchmark (`bench/quality.py`) counts the ones
an edit removed; the clearing planner keeps the outputs the agent has been quoting; the live
counters (`RecallIndex`) count uses of what only removed content held.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.context.messages import Message, content_text

_CHUNK = re.compile(r"[\w./-]+")
_PARTS = re.compile(r"[./-]+")
_LETTER = re.compile(r"[^\W\d]")
_LEADING_DIGITS = re.compile(r"\d+")

# Words of prose, Python and the shell too common to tell one output from another.
_COMMON_WORDS = """
able about above after again against also always another anything args around assert async available await
back bash because been before being below best better between bool both break bytes call called calls change
changed changes check class code command commands continue could current default dict does doing done down
each echo either elif else empty error errors even every exact example except exists expected fail failed
fails false file files finally find first fixed following found from function further gets given global going
good grep have head here however import init instead into isinstance issue itself just keep know kwargs lambda
last least less let's like line lines list look looking looks made main make makes many maybe method more most
much must name need needed needs never next none nonlocal note nothing number object only open other output
over pass passed path print problem properly python python3 raise range really result return returncode
returns right same seems self should show shows similar since some something stderr stdout still such super
sure tail take test test_ tested testing tests than that their them then there these they thing think this
those though thought through time true tuple type under until update updated used uses using value values very
want well were what when where whether which while will with within without work works would write wrong yield
your
"""
COMMON = frozenset(_COMMON_WORDS.split())


def _specific(word: str) -> bool:
    if word.isdigit():
        return len(word) >= 2
    return len(word) >= 4 and _LETTER.search(word) is not None and word.lower() not in COMMON


def specific_tokens(text: str) -> frozenset[str]:
    """The distinct specific tokens of `text`: whole paths and dotted names, and their parts."""
    found: set[str] = set()
    for chunk in _CHUNK.findall(text):
        chunk = chunk.strip("./-")
        if _specific(chunk):
            found.add(chunk)
        if _PARTS.search(chunk):
            found.update(part for part in _PARTS.split(chunk) if _specific(part))
        elif chunk[:1].isdigit() and (digits := _LEADING_DIGITS.match(chunk)) and _specific(digits[0]):
            found.add(digits[0])  # sed's `430p`, `42nd`
    return frozenset(found)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def call_arguments(message: Message) -> list[str]:
    """The string values of an assistant message's tool-call arguments (JSON parsed when it parses)."""
    texts: list[str] = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        raw = function.get("arguments")
        try:
            texts.extend(_strings(orjson.loads(raw) if isinstance(raw, str) else raw))
        except orjson.JSONDecodeError:
            texts.append(str(raw))
    return texts


def message_tokens(message: Message) -> frozenset[str]:
    """The specific tokens of a message: its text and, for an assistant, its calls' arguments."""
    text = content_text(message)
    if text is None and message.get("content") is not None:
        text = " ".join(_strings(message.get("content")))
    parts = [text] if text else []
    if message.get("role") == "assistant":
        parts += call_arguments(message)
    return specific_tokens("\n".join(parts)) if parts else frozenset()


def call_keys(message: Message) -> list[str]:
    """One key per tool call of an assistant message: its function's name and exact arguments."""
    keys = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            keys.append(f"{function.get('name')}\x00{function.get('arguments')}")
    return keys


def quoted_outputs(
    output_tokens: Sequence[frozenset[str]], quotes: Sequence[frozenset[str]], min_quoted: int = 1
) -> list[bool]:
    """For each output, whether at least `min_quoted` of its specific tokens appear in `quotes` (the agent's recent
    messages), tokens held by several outputs counting only for the newest that holds them."""
    quoted = frozenset().union(*quotes) if quotes else frozenset()
    claimed: set[str] = set()
    marks = [False] * len(output_tokens)
    for k in range(len(output_tokens) - 1, -1, -1):
        hits = (output_tokens[k] & quoted) - claimed
        marks[k] = len(hits) >= min_quoted
        claimed |= output_tokens[k]
    return marks


def _hash(token: str) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8", "surrogatepass"), digest_size=6).digest(), "big")


@dataclass
class RecallIndex:
    """Per session: hashes of the specific tokens only removed content held, of the calls whose output was
    cleared, and how often the agent's newest message used either (a recall miss; a re-run).

    Indexed when content is removed, so a turn costs work in proportion to the agent's newest message.
    """

    removed: set[int] = field(default_factory=set)
    cleared_calls: set[int] = field(default_factory=set)
    misses: int = 0
    reruns: int = 0

    def copy(self) -> RecallIndex:
        return RecallIndex(set(self.removed), set(self.cleared_calls), self.misses, self.reruns)

    def index_removed(self, removed: Iterable[Message], calls: Iterable[str], kept: frozenset[str]) -> None:
        """Remember what an epoch removed: its tokens not in `kept` (what is never edited), its calls."""
        for message in removed:
            self.removed.update(_hash(t) for t in message_tokens(message) - kept)
        self.cleared_calls.update(_hash(key) for key in calls)

    def observe(self, newest: Message, present: Sequence[str]) -> tuple[int, int]:
        """Count the newest assistant message's recall miss and re-runs; `present` is the text still sent.

        A token the index holds is checked against `present` only when it is used, and forgotten once found
        there (new output holds it again), so the check stays rare.
        """
        misses = 0
        if self.removed:
            for token in message_tokens(newest):
                h = _hash(token)
                if h not in self.removed:
                    continue
                if any(token in text for text in present):
                    self.removed.discard(h)
                else:
                    misses = 1
        reruns = sum(_hash(key) in self.cleared_calls for key in call_keys(newest))
        self.misses += misses
        self.reruns += reruns
        return misses, reruns

    def to_dict(self) -> dict[str, Any]:
        return {
            "removed": sorted(self.removed),
            "cleared_calls": sorted(self.cleared_calls),
            "misses": self.misses,
            "reruns": self.reruns,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecallIndex:
        return cls(
            {int(h) for h in data.get("removed", ())},
            {int(h) for h in data.get("cleared_calls", ())},
            int(data.get("misses", 0)),
            int(data.get("reruns", 0)),
        )
