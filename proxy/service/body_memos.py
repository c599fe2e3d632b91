"""A session's next body (chat, Messages, Responses), parsed only where it differs from the last one.

An agent's request repeats its previous request byte for byte and appends a few messages.
Parsing, validating and digesting the repeated part again is most of a warm turn's CPU on
a long conversation, so the last body of each recent conversation is remembered (bounded
by `[state] body_memo_mb`): its bytes up to the end of its last message, where its first
message starts, and those messages parsed and digested.

When the next body starts with exactly those bytes, only the rest is parsed: the
remembered messages are replaced by one marker element, which leaves a JSON document that
parses to the same body (a JSON parser's state after a prefix depends only on the prefix's
bytes), and the marker must come back as the first message, or the full parse is used.
When it starts with the bytes of only the first few remembered messages (Claude Code moves its
cache breakpoint from the last message to the new last one, so its previous last message
changes), those stand in for the marker and the rest is parsed the same way.
When the bytes after the messages are the last body's too (an agent's tools, model and options
rarely change), only the new messages are parsed and the other fields are the last body's values.
A Responses body is read the same way, its `input` items standing for the messages.
Every other case (a first request, an edited history, a body this module cannot read)
takes the full parse, which remains the reference.
"""

from __future__ import annotations

import itertools
import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.context.messages import message_digest
from proxy.dialects.base import kept_json
from proxy.dialects.body_checks import check_messages, has_wide_number, may_hold_wide_integer, parse_chat_body
from proxy.dialects.messages import MESSAGES
from proxy.dialects.responses import RESPONSES, check_input

# Stands in for the remembered messages; random per process, so no client can send it.
MARKER = "\x00context-proxy-remembered-" + secrets.token_hex(16)
_MARKER_JSON = orjson.dumps(MARKER)
# A JSON string, or one bracket (outside strings, since strings are matched whole).
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_OPEN, _QUOTE = frozenset(b"[{"), ord('"')  # any other token is a closing bracket
# Memos per client and session name (one per conversation in it): the candidates a request is compared with.
PER_SCOPE = 32
# A scope whose bodies keep missing stops paying for new memos (the scan costs about a parse).
MISSES_BEFORE_PAUSE, RETRY_EVERY = 3, 16
MAX_CONVERSATIONS_TRACKED = 10_000
RECENT_OUTCOMES = 256  # memo hits and evictions weighed for the thrash check (older ones count half)


@dataclass(frozen=True, slots=True)
class Reading:
    """How one API's bodies are read: the full parse (the reference: the client's exact errors), the array of
    messages (`field`), the check of a body whose messages past `offset` the memo did not hold, and the key each
    message is known by (`key_is_json`: as large as the message, so a memo holds it too)."""

    parse: Callable[[bytes], dict[str, Any]]
    field: str
    check: Callable[[dict[str, Any], list[Any], int], None]
    key: Callable[[Any], bytes]
    key_is_json: bool = False

    @property
    def array(self) -> re.Pattern[bytes]:
        return _ARRAYS[self.field]


_ARRAYS = {field: re.compile(rb'"' + field.encode() + rb'"\s*:\s*\[\s*') for field in ("messages", "input")}


def _check_chat(body: dict[str, Any], messages: list[Any], offset: int) -> None:
    check_messages(messages, offset=offset)


def _check_nothing(body: dict[str, Any], messages: list[Any], offset: int) -> None:
    """Messages bodies: what the adapter cannot map goes as sent (`MessagesDialect.unedited_reason`)."""


# Chat: each message's `message_digest`. Messages and Responses: each message's (input item's) exact JSON, which
# the dialect compares with the conversation a body continues (`proxy.dialects.messages`, `.responses`); made
# once per message, not once per turn.
CHAT_READING = Reading(parse_chat_body, "messages", _check_chat, message_digest)
MESSAGES_READING = Reading(MESSAGES.parse, "messages", _check_nothing, kept_json, key_is_json=True)
RESPONSES_READING = Reading(RESPONSES.parse, "input", check_input, kept_json, key_is_json=True)
READINGS = {"chat": CHAT_READING, "messages": MESSAGES_READING, "responses": RESPONSES_READING}


@dataclass(frozen=True, slots=True)
class Parsed:
    """A validated body and each message's key (`Reading.key`: chat, its `message_digest`)."""

    body: dict[str, Any]
    digests: list[bytes]
    reused: int = 0  # messages taken from the memo instead of parsed
    # The caller's notes on what follows from the body but its new messages (its tools, its first messages):
    # the same dict comes back for the conversation's next bodies while every byte but their new messages is
    # the same (the body's other fields are then the very objects parsed before); a new dict otherwise.
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Memo:
    prefix: bytes  # the body up to the end of its last message
    start: int  # offset of its first message
    ends: tuple[int, ...]  # where each message ends in `prefix` (the last: its length)
    messages: list[dict[str, Any]]  # parsed; shared with later turns, never mutated
    digests: list[bytes]
    after: bytes  # the body after its last message: the array's close and the fields that follow
    body: dict[str, Any]  # the body parsed: its other fields are reused while `after` is unchanged; never mutated
    notes: dict[str, Any]
    per_byte: int = 3  # what it holds per byte of JSON: the bytes, their parsed objects (about twice), the keys

    @property
    def cost(self) -> int:
        """Bytes held, roughly: the raw bytes kept plus their parsed objects (and keys as large as the JSON)."""
        return self.per_byte * (len(self.prefix) + len(self.after))


def element_ends(raw: bytes, at: int) -> list[int] | None:
    """Where each object or array element ends, for an array read from `at` (its start, or just after an element).

    None when the array does not close (the body is not what this module can read). Other elements (strings,
    numbers) are not counted: the callers compare the count with the elements parsed.
    """
    depth = 0
    ends: list[int] = []
    for match in _TOKEN.finditer(raw, at):
        byte = raw[match.start()]
        if byte == _QUOTE:
            continue
        if byte in _OPEN:
            depth += 1
        else:
            depth -= 1
            if depth < 0:
                return ends
            if depth == 0:
                ends.append(match.end())
    return None


def array_end(raw: bytes, at: int) -> int | None:
    """Where the last element ends, for an array read from `at`; None when the array does not close."""
    ends = element_ends(raw, at)
    return None if ends is None else (ends[-1] if ends else at)


def messages_start(raw: bytes, array: re.Pattern[bytes] = _ARRAYS["messages"]) -> int | None:
    """Offset of the first element of the top-level `messages` array (or the one `array` finds), or None.

    Only a key at the top level counts: brackets and strings are tracked from the start.
    """
    depth = 0
    for match in _TOKEN.finditer(raw):
        byte = raw[match.start()]
        if byte == _QUOTE:
            if depth == 1 and (key := array.match(raw, match.start())):
                return key.end()
            continue
        depth += 1 if byte in _OPEN else -1
    return None


def _remembered(raw: bytes, parsed: Parsed, reading: Reading) -> _Memo | None:
    """A memo of a fully parsed body, when its messages array can be located and checked."""
    body, messages = parsed.body, parsed.body.get(reading.field)
    start = messages_start(raw, reading.array)
    if start is None or not isinstance(messages, list) or not messages:
        return None
    ends = element_ends(raw, start)
    if ends is None or len(ends) != len(messages):
        return None
    end = ends[-1]
    # The located array must be the one the parser used: with it replaced by the marker, the
    # same parser must see exactly the marker (a duplicate `messages` key would show here).
    try:
        check = orjson.loads(raw[:start] + _MARKER_JSON + raw[end:])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(check, dict) or check.get(reading.field) != [MARKER]:
        return None
    per_byte = 4 if reading.key_is_json else 3
    return _Memo(raw[:end], start, tuple(ends), messages, parsed.digests, raw[end:], body, parsed.notes, per_byte)


def _leading(memo: _Memo, raw: bytes) -> int:
    """How many of the memo's messages `raw` starts with, byte for byte (0: not even the first), for a `raw` that
    does not start with all of them (the caller compared the whole prefix first)."""
    prefix, ends = memoryview(memo.prefix), memo.ends
    if not raw.startswith(prefix[: ends[0]]):
        return 0
    if len(ends) > 2 and raw.startswith(prefix[: ends[-2]]):  # only the last changed: a moved breakpoint
        return len(ends) - 1
    low, high = 1, len(ends) - 1  # `low` messages lead; more than `high` do not
    while low < high:
        mid = (low + high + 1) // 2
        if raw.startswith(prefix[: ends[mid - 1]]):
            low = mid
        else:
            high = mid - 1
    return low


def _extend(memo: _Memo, raw: bytes, reading: Reading, kept: int) -> tuple[Parsed, _Memo] | None:
    """The body parsed past the memo's first `kept` messages (which `raw` starts with), and its memo; None when
    the shortcut does not hold."""
    known = memo.ends[kept - 1]
    ends = element_ends(raw, known)
    if ends is None:
        return None
    end = ends[-1] if ends else known
    after = raw[end:]
    if after == memo.after:  # only the new messages are new: the other fields are the last body's, as parsed
        fresh = raw[known:end]
        tail = _loads(b"[" + _MARKER_JSON + fresh + b"]")
        if not isinstance(tail, list) or (may_hold_wide_integer(fresh) and has_wide_number(tail)):
            return None
        body, notes = dict(memo.body), memo.notes
    else:
        body = _loads(raw[: memo.start] + _MARKER_JSON + raw[known:])
        if not isinstance(body, dict):
            return None  # not a body to extend: the full parse judges it (and gives the client its exact error)
        if (may_hold_wide_integer(raw[: memo.start]) or may_hold_wide_integer(raw[known:])) and has_wide_number(body):
            return None  # one to parse exactly (body_checks)
        tail, notes = body.get(reading.field), {}
    if not isinstance(tail, list) or not tail or tail[0] != MARKER:
        return None
    new = tail[1:]
    if len(new) != len(ends):
        return None  # an element that is no object: the full parse judges it
    reading.check(body, new, kept)
    messages = memo.messages[:kept] + new
    digests = memo.digests[:kept] + [reading.key(m) for m in new]
    body[reading.field] = messages
    parsed = Parsed(body, digests, reused=kept, notes=notes)
    every_end = memo.ends[:kept] + tuple(ends)
    return parsed, _Memo(raw[:end], memo.start, every_end, messages, digests, after, body, notes, memo.per_byte)


def _loads(doc: bytes) -> Any:
    """`doc` parsed, or None where it does not parse."""
    try:
        return orjson.loads(doc)
    except orjson.JSONDecodeError:
        return None


def _opening(digests: list[bytes]) -> bytes:
    """Which conversation a body is, for counting edits: its first two messages (system prompt and task)."""
    return b"".join(digests[:2])


class BodyMemos:
    """The last body of each recent conversation, within a byte budget (least recently used go first)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.held = 0
        self._memos: OrderedDict[int, tuple[str, _Memo]] = OrderedDict()
        self._scopes: dict[str, list[int]] = {}
        self._misses: dict[tuple[str, bytes], int] = {}  # edited-history streak per conversation
        # Recent memos used, and evicted before any use: more conversations than the budget holds
        # would evict every memo before its next turn, so new ones are then made only now and then.
        self.hits = self.wasted = 0.0
        self._skipped = 0
        self._ids = itertools.count()
        self._lock = threading.Lock()  # parsing may run on the engine's worker thread

    def __len__(self) -> int:
        return len(self._memos)

    def parse(self, raw: bytes, scope: str, reading: Reading = CHAT_READING) -> Parsed:
        """The validated body; raises InvalidRequest like `reading.parse` (chat: `parse_chat_body`).

        `scope`: whose memos the body is compared with; one scope holds one API's bodies (their keys differ).
        The first memo the body extends is used, else the first whose leading messages it starts with."""
        with self._lock:
            candidates = [(key, self._memos[key][1]) for key in self._scopes.get(scope, ())]
        tries = [(key, memo, len(memo.ends)) for key, memo in candidates if raw.startswith(memo.prefix)]
        if not tries:  # none it extends: the first whose leading messages it starts with
            tries = next(([(key, memo, kept)] for key, memo in candidates if (kept := _leading(memo, raw))), [])
        for key, memo, kept in tries:
            if (found := _extend(memo, raw, reading, kept)) is not None:
                parsed, successor = found
                with self._lock:
                    self._misses.pop((scope, _opening(parsed.digests)), None)
                    self._count(hit=True)
                    if kept == len(memo.ends) or _opening(memo.digests) == _opening(successor.digests):
                        self._drop(key)  # its conversation's next body stands in for it
                    self._add(scope, successor)  # (else it led another conversation: both stay)
                return parsed
        body = reading.parse(raw)
        messages = body.get(reading.field)
        digests = [reading.key(m) for m in messages] if isinstance(messages, list) else []
        parsed = Parsed(body, digests)
        if self._worth_remembering(scope, digests, [memo for _, memo in candidates]):
            remembered = _remembered(raw, parsed, reading)
            if remembered is not None and remembered.cost <= self.budget:
                with self._lock:
                    self._add(scope, remembered)
        return parsed

    def _worth_remembering(self, scope: str, digests: list[bytes], candidates: list[_Memo]) -> bool:
        """False for a conversation whose history keeps changing: its memos would never be used.

        A body that opens like a remembered one but did not extend it is an edited history (a new
        conversation opens differently); after a few in a row, memos are made only now and then.
        """
        if self.budget <= 0:
            return False
        opening = _opening(digests)
        with self._lock:
            misses = self._misses.get((scope, opening), 0)
            if any(_opening(memo.digests) == opening for memo in candidates):
                misses = self._misses[(scope, opening)] = misses + 1
                if len(self._misses) > MAX_CONVERSATIONS_TRACKED:
                    self._misses.clear()
            if self.wasted > self.hits:  # thrashing: the budget is too small for the conversations
                self._skipped += 1
                if self._skipped % RETRY_EVERY:
                    return False
        return misses < MISSES_BEFORE_PAUSE or misses % RETRY_EVERY == 0

    def _count(self, *, hit: bool) -> None:
        if hit:
            self.hits += 1
        else:
            self.wasted += 1
        if self.hits + self.wasted > RECENT_OUTCOMES:
            self.hits, self.wasted = self.hits / 2, self.wasted / 2

    def _add(self, scope: str, memo: _Memo) -> None:
        """Remember `memo` as its conversation's last body: an older memo of the same conversation goes."""
        opening = _opening(memo.digests)
        for stale in [k for k in self._scopes.get(scope, ()) if _opening(self._memos[k][1].digests) == opening]:
            self._drop(stale)
        key = next(self._ids)
        self._memos[key] = (scope, memo)
        keys = self._scopes.setdefault(scope, [])
        keys.insert(0, key)
        self.held += memo.cost
        if len(keys) > PER_SCOPE:
            self._drop(keys[-1])
            self._count(hit=False)
        while self.held > self.budget and self._memos:
            self._drop(next(iter(self._memos)))
            self._count(hit=False)

    def _drop(self, key: int) -> None:
        entry = self._memos.pop(key, None)
        if entry is None:
            return
        scope, memo = entry
        self.held -= memo.cost
        keys = self._scopes.get(scope)
        if keys is not None:
            keys.remove(key)
            if not keys:
                del self._scopes[scope]
