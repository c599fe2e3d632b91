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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.context.lru import ByteLru
from proxy.context.messages import Message, content_text

_CHUNK = re.compile(r"[\w./-]+")
_PARTS = re.compile(r"[./-]+")
_LETTER = re.compile(r"[^\W\d]")
_LEADING_DIGITS = re.compile(r"\d+")
HASH_BYTES = 65  # one hash of `RecallIndex` in memory (a 48-bit int and its set slot)

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
    """A number of 2+ digits, or a code-like word of 4+ characters: a path or dotted name, or an identifier
    with `_`, a digit, an inner capital or all capitals. Plain words (`array`, `Convert`) are prose."""
    if word.isdigit():
        return len(word) >= 2
    if len(word) < 4 or not _LETTER.search(word) or word.lower() in COMMON:
        return False
    return not (word.isalpha() and (word.islower() or word[1:].islower()))


def specific_tokens(text: str) -> frozenset[str]:
    """The distinct specific tokens of `text`: whole paths and dotted names, and their specific parts."""
    return TOKEN_SETS.of(text)


def _specific_tokens(text: str) -> frozenset[str]:
    found: set[str] = set()
    known = _CHUNKS
    for chunk in _chunks(text):  # each distinct chunk once: what it adds depends on it alone
        tokens = known.get(chunk)
        if tokens is None:
            tokens = _chunk_tokens(chunk if isinstance(chunk, str) else chunk.decode())
            if len(chunk) <= CHUNK_MEMO_MAX_CHARS:
                if len(known) >= CHUNK_MEMO_ENTRIES:
                    known.clear()  # a new start, not an LRU: the words a session uses come back within a turn
                known[chunk] = tokens
        if tokens:
            found.update(tokens)
    return frozenset(found)


def _chunks(text: str) -> set[str] | set[bytes]:
    """The distinct matches of `_CHUNK` in `text`. An ASCII text (most tool output) is split by a byte table
    instead, twice as fast; its chunks stay bytes (the memo's keys: no decoding when the chunk is known)."""
    if text.isascii():
        return set(text.encode().translate(_CHUNK_BYTES).split())
    return set(_CHUNK.findall(text))


def _chunk_tokens(chunk: str) -> tuple[str, ...]:
    """The specific tokens one chunk of text adds: itself, its parts, its leading digits."""
    found: set[str] = set()
    chunk = chunk.strip("./-")
    if _specific(chunk):
        found.add(chunk)
    if _PARTS.search(chunk):
        found.update(part for part in _PARTS.split(chunk) if _specific(part))
        found.update(part for part in chunk.split("/") if _specific(part))  # `query.py` of a path
    elif chunk[:1].isdigit() and (digits := _LEADING_DIGITS.match(chunk)) and _specific(digits[0]):
        found.add(digits[0])  # sed's `430p`, `42nd`
    return tuple(found)


# `_CHUNK`'s characters among the ASCII ones (`\w` there is letters, digits and `_`), the rest made a space.
_CHUNK_BYTES = bytes(
    byte if chr(byte).isascii() and (chr(byte).isalnum() or chr(byte) in "_./-") else 32 for byte in range(256)
)
# What each short chunk adds, kept: an agent's texts repeat their words (names, paths, keywords), and a chunk's
# tokens cost ~1-2 µs to work out against ~0.1 µs to look up. A fixed bound, emptied when full: at most
# `CHUNK_MEMO_ENTRIES` chunks of `CHUNK_MEMO_MAX_CHARS` characters, ~2.5 MB at worst (~150 bytes an entry with
# its slot).
CHUNK_MEMO_ENTRIES = 16_384
CHUNK_MEMO_MAX_CHARS = 48
_CHUNKS: dict[str | bytes, tuple[str, ...]] = {}


# Texts shorter than this are tokenized again each time they are asked about (cheaper than keeping them).
MEMO_MIN_CHARS = 256
TOKEN_BYTES = 72  # one specific token in a kept set (its str and the set's slot), roughly
MEMO_ENTRY_BYTES = 200  # one kept text's entry beside its characters and tokens


class TokenSets(ByteLru[str, frozenset[str]]):
    """`specific_tokens` of the long texts asked about lately, by text. Every turn reads a session's outputs again
    (which ones the agent is quoting, what an epoch removes, how far it reaches), and an output's text never
    changes; a warm body's repeated messages are the very objects of the last one (`proxy.service.body_memos`), so
    finding a text here costs its cached hash. Bounded in bytes (`fit`, a share of `[state] memory_mb`), the least
    recently used dropped first; `held` is what it holds now (each text counted whole, though the body memos
    usually hold the same string). Shared by every engine in the process; safe between threads."""

    def __init__(self, max_bytes: int = 16 * 1024 * 1024) -> None:
        super().__init__(max_bytes)

    def of(self, text: str) -> frozenset[str]:
        if len(text) < MEMO_MIN_CHARS:
            return _specific_tokens(text)
        tokens = self.get(text)
        if tokens is None:
            tokens = _specific_tokens(text)
            self.put(text, tokens, MEMO_ENTRY_BYTES + len(text) + TOKEN_BYTES * len(tokens))
        return tokens


TOKEN_SETS = TokenSets()


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


def never_edited(messages: Sequence[Message]) -> frozenset[str]:
    """Tokens of what no edit removes: the system messages and the task (the first user message)."""
    fixed = [m for m in messages if m.get("role") in ("system", "developer")]
    fixed += [m for m in messages if m.get("role") == "user"][:1]
    return frozenset().union(*(message_tokens(m) for m in fixed))


# How many of an output's specific tokens later messages must quote for it to count as in use.
MIN_QUOTED = 1
# What is left of a recall miss's weight after each later agent message: a session's misses fade
# with a half-life of about 7 messages (`RecallIndex.heat`; bench/quality.py measured 0.8, 0.85, 0.9).
MISS_FADE = 0.9


def outputs_in_use(messages: Sequence[Message], outputs: Sequence[int], recent: int) -> set[int]:
    """The outputs (indices into `messages`) the agent is working with: each holds a specific token that one of
    its last `recent` assistant messages wrote after seeing it, that no newer output holds and the system and
    task do not. The call that produced an output does not count: it names what it asks for.

    Measured on the traces (bench/quality.py), this finds the outputs the agent's next message draws on far
    better than recency does: what it quoted lately, it quotes again.
    """
    if recent <= 0 or not outputs:
        return set()
    fixed = never_edited(messages)
    wanted = set(outputs)
    quoted: set[str] = set()
    claimed: set[str] = set()
    used = set()
    seen = 0
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if message.get("role") == "assistant":
            if seen == recent:
                if not quoted:
                    break
                continue
            quoted |= message_tokens(message) - fixed
            seen += 1
        elif i in wanted and quoted:
            hits = message_tokens(message) & quoted
            if len(hits - claimed) >= MIN_QUOTED:
                used.add(i)
            claimed |= hits
    return used


def _hash(token: str) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8", "surrogatepass"), digest_size=6).digest(), "big")


@dataclass
class RecallIndex:
    """Per session (in the journal): hashes of the specific tokens of content the proxy removed, and of the calls
    whose output it cleared; how many turns the agent's newest message used what only removed content held
    (recall misses) and how many calls it re-ran after their output was cleared; `heat`, the misses
    fading by `MISS_FADE` an agent message, says how hard the agent is reaching for what was cleared now.

    Filled when content is removed, so a turn costs work in proportion to the agent's newest message.
    """

    removed: set[int] = field(default_factory=set)
    cleared_calls: set[int] = field(default_factory=set)
    misses: int = 0
    reruns: int = 0
    heat: float = 0.0
    # What the agent's messages used from tool outputs (`reach.reach_of`): evidence tokens, and those only outputs
    # older than the newest held. A finished session's sums join its agent's history (`reach.Reach`).
    evidence: int = 0
    older: int = 0

    def approx_bytes(self) -> int:
        """What the index holds in memory, roughly (a set entry and its int: measured ~65 bytes)."""
        return HASH_BYTES * (len(self.removed) + len(self.cleared_calls))

    def copy(self) -> RecallIndex:
        return RecallIndex(
            set(self.removed), set(self.cleared_calls), self.misses, self.reruns, self.heat, self.evidence, self.older
        )

    def forget(self, messages: Sequence[Message], calls: Iterable[str], kept: frozenset[str]) -> None:
        """Index what an epoch removed: the messages' tokens not in `kept` (what is never edited), their calls."""
        for message in messages:
            self.removed.update(_hash(t) for t in message_tokens(message) - kept)
        self.cleared_calls.update(_hash(key) for key in calls)

    def observe(
        self, newest: Message, seen: Sequence[Message], tokens: frozenset[str] | None = None
    ) -> tuple[int, int]:
        """The newest assistant message's tokens used from removed content only, and its re-runs of cleared calls.

        `seen` is what the agent was sent before it wrote `newest`; `tokens` its `message_tokens`, when the caller
        has them. An indexed token is looked for there only when it is used, and dropped from the index once
        found (a newer output holds it again).
        """
        missed = 0
        if self.removed:
            # What the seen messages hold, made once and only when a token is looked for: their texts, and (only
            # for a token no text holds) their calls' arguments, which cost a parse each.
            texts: list[str] | None = None
            arguments: list[str] | None = None
            for token in message_tokens(newest) if tokens is None else tokens:
                h = _hash(token)
                if h not in self.removed:
                    continue
                if texts is None:
                    texts = [text for m in seen if (text := content_text(m))]
                if not any(token in text for text in texts):
                    if arguments is None:
                        arguments = [" ".join(found) for m in seen if (found := call_arguments(m))]
                    if not any(token in text for text in arguments):
                        missed += 1
                        continue
                self.removed.discard(h)
        reruns = sum(_hash(key) in self.cleared_calls for key in call_keys(newest)) if self.cleared_calls else 0
        self.misses += missed > 0
        self.heat = self.heat * MISS_FADE + (missed > 0)
        self.reruns += reruns
        return missed, reruns

    def summary(self) -> dict[str, Any]:
        """What `/sessions/{id}` shows: turns whose agent message used what only removed content held, calls
        re-run after their output was cleared, and the misses as they fade (each unit of heat doubles the tool
        output clearing keeps, up to `miss_keep_tokens`)."""
        return {"recall_misses": self.misses, "cleared_reruns": self.reruns, "miss_heat": round(self.heat, 3)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "removed": sorted(self.removed),
            "cleared_calls": sorted(self.cleared_calls),
            "misses": self.misses,
            "reruns": self.reruns,
            "heat": self.heat,
            "evidence": self.evidence,
            "older": self.older,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecallIndex:
        return cls(
            {int(h) for h in data.get("removed", ())},
            {int(h) for h in data.get("cleared_calls", ())},
            int(data.get("misses", 0)),
            int(data.get("reruns", 0)),
            float(data.get("heat", 0.0)),
            int(data.get("evidence", 0)),
            int(data.get("older", 0)),
        )
