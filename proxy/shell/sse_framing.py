"""SSE framing in one pass: whole events to read, and a bound past which an event is relayed unread.

An event is held until its blank line (a client acts on whole events only, so holding one
costs it nothing) unless it grows past `bound` bytes: then what is held, and the rest of that
event as it arrives, goes on without being kept or parsed. Every byte is searched for an event
end a bounded number of times, so the work is linear in the bytes relayed and the memory per
stream stays under `bound`, however long an event is.
"""

from __future__ import annotations

import re
from typing import NamedTuple

EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
EVENT_ENDINGS = (b"\r\n\r\n", b"\n\n", b"\r\r")  # what EVENT_END finds, at a chunk's end
_LINE_FEEDS = (b"\n\n",)  # the one event end possible in bytes without a carriage return
_OVERLAP = 3  # an event end is at most 4 bytes: this many of them may sit before a read's first byte

# An event up to this size is held whole (and may be parsed); a longer one is relayed as it comes.
# OpenAI's `response.completed` repeats the whole answer (and carries the usage): 4 MiB holds the
# longest answers with room to spare, while a hostile 80 MB event never sits in memory.
MAX_EVENT_BYTES = 4 * 1024 * 1024


class Piece(NamedTuple):
    """Bytes to relay: one or more whole events (`whole`), or part of an event past the bound.

    `complete`: the piece ends where an event ends (always, for whole events).
    """

    data: bytes
    whole: bool
    complete: bool = True


class SseEvents:
    """Splits an SSE byte stream into whole events as reads arrive; see the module docstring."""

    def __init__(self, bound: int = MAX_EVENT_BYTES) -> None:
        self.bound = bound
        self._held = bytearray()  # the unfinished event, while it is under the bound
        self._searched = 0  # bytes of `_held` already searched for an event end
        self.unread = False  # inside an event past the bound: its start has been relayed
        self._tail = b""  # while `unread`: its last bytes, where its end may already have begun

    @property
    def held(self) -> int:
        """Bytes of an unfinished event kept back right now (never more than the bound)."""
        return len(self._held)

    def takes_whole(self, chunk: bytes) -> bool:
        """`chunk` is whole events, and nothing is held or being relayed unread: `feed` would return it as one piece."""
        return not self._held and not self.unread and chunk.endswith(EVENT_ENDINGS)

    def feed(self, chunk: bytes) -> list[Piece]:
        """What `chunk` completes, in order; an unfinished event stays held."""
        pieces: list[Piece] = []
        if self.unread:
            chunk = self._through_unread(chunk, pieces)
        if not chunk:
            return pieces
        if not self._held and chunk.endswith(EVENT_ENDINGS):
            pieces.append(Piece(chunk, whole=True))  # whole events: the usual read
            return pieces
        self._held += chunk
        end = _last_event_end(self._held, max(0, self._searched - _OVERLAP))
        if end:
            pieces.append(Piece(bytes(self._held[:end]), whole=True))
            del self._held[:end]  # what is left came in this read: deleting it is linear too
        self._searched = len(self._held)
        if len(self._held) > self.bound:
            pieces.append(Piece(bytes(self._held), whole=False, complete=False))
            self._tail = bytes(self._held[-_OVERLAP:])
            self._held.clear()
            self._searched = 0
            self.unread = True
        return pieces

    def finish(self) -> bytes:
        """The unfinished event at the end of the stream (b"" when none, or when it was relayed unread)."""
        rest = bytes(self._held)
        self._held.clear()
        self._searched = 0
        return rest

    def _through_unread(self, chunk: bytes, pieces: list[Piece]) -> bytes:
        """Relay `chunk` up to the end of the event past the bound; return what follows that end."""
        straddling = EVENT_END.search(self._tail + chunk[:_OVERLAP])
        end = straddling.end() - len(self._tail) if straddling is not None else _first_event_end(chunk)
        if not end:
            pieces.append(Piece(chunk, whole=False, complete=False))
            self._tail = (self._tail + chunk[-_OVERLAP:])[-_OVERLAP:]
            return b""
        pieces.append(Piece(chunk[:end], whole=False))
        self.unread = False
        self._tail = b""
        return chunk[end:]


def _first_event_end(data: bytes) -> int:
    """Where the first event in `data` ends (0 when none does). Plain searches: a regex alternation is 20x slower."""
    if b"\n" not in data and b"\r" not in data:
        return 0  # the usual read of a long event: JSON text has no raw line breaks
    ends = [(at, at + len(sep)) for sep in EVENT_ENDINGS if (at := data.find(sep)) >= 0]
    return min(ends)[1] if ends else 0


def _last_event_end(data: bytes | bytearray, start: int = 0) -> int:
    """Where the last complete event in `data` ends, searching `data[start:]` only (0 when there is none)."""
    if data.endswith(EVENT_ENDINGS):
        return len(data)
    end = 0
    for separator in EVENT_ENDINGS:
        at = data.rfind(separator, start)
        if at >= 0:
            end = max(end, at + len(separator))
    return end


def event_around(data: bytes, at: int) -> tuple[int, int]:
    """The bounds of the event of `data` (whole events) that byte `at` stands in: plain searches, no walk.

    A separator absent from `data` would be searched for over all of it, back to its start, for every event
    asked about: without a carriage return in `data` (every stream seen) only the blank line is looked for.
    """
    separators = EVENT_ENDINGS if b"\r" in data else _LINE_FEEDS
    start = 0
    for separator in separators:
        before = data.rfind(separator, 0, at)
        if before >= 0:
            start = max(start, before + len(separator))
    ends = [(found, found + len(sep)) for sep in separators if (found := data.find(sep, at)) >= 0]
    return start, (min(ends)[1] if ends else len(data))


def event_data(event: bytes) -> bytes:
    """The `data:` lines of one event, joined as the SSE spec joins them."""
    return b"\n".join(line[5:].removeprefix(b" ") for line in event.splitlines() if line.startswith(b"data:"))
