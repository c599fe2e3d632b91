"""How each streaming API ends a stream, and the error event that tells a client its stream was cut.

An upstream that closes (or loses) a stream before the API's end marker leaves a client with
half an answer that looks whole: the official SDKs raise nothing. The relay watches for the
marker and, when the stream ends without it, appends one error event in that API's own
streaming form, which each SDK raises as an exception:

| API | ends with | the error event the proxy appends |
|---|---|---|
| chat completions | a choice's `finish_reason`, or `data: [DONE]` | `data: {"error": {...}}` |
| Responses | `response.completed` / `.failed` / `.incomplete` | `event: error` (`type: "error"`) |
| Anthropic Messages | `message_stop` | `event: error` with Anthropic's error JSON |

An error event the upstream sends itself also ends a stream (the SDK raised on it already).
Markers are matched in the raw bytes: each pattern needs a quote or a line break where JSON
text can only hold an escaped one, so no model output can fake an end.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from proxy.errors import anthropic_error_body, error_body
from proxy.metrics import METRICS
from proxy.shell.sse_framing import Piece

log = logging.getLogger("proxy.relay")

STREAMS_CUT = METRICS.counter(
    "context_proxy_streams_cut_total",
    "Upstream streams that ended before their API's end marker; the client got an error event (a 502 before any byte)",
    ["api", "cause"],
)

# Why a stream ended early (the `cause` label): the upstream closed it, broke the connection, or went silent.
_CODES = {"eof": "upstream_incomplete", "reset": "upstream_broken", "timeout": "upstream_timeout"}
_MESSAGES = {
    "eof": "The upstream ended the stream before it was complete: this answer is cut short.",
    "reset": "The upstream connection broke before the stream was complete: this answer is cut short.",
    "timeout": "The upstream stopped sending before the stream was complete: this answer is cut short.",
}
_CARRY = 64  # longer than any marker
_SEQUENCE = re.compile(rb'"sequence_number"\s*:\s*(\d+)')


@dataclass(frozen=True)
class StreamApi:
    """One API's stream: its end markers, and its error event (message, code, last sequence number).

    Each marker starts with a literal: the marker is searched for only where the literal is in the
    bytes (a plain search), and then as one pattern that starts with it, which the regex engine scans
    for by that literal (searching every event with one alternation of the markers costs 20 times more;
    finding each literal and matching there, 1.7 times more).
    """

    name: str
    markers: tuple[tuple[bytes, re.Pattern[bytes]], ...]  # (literal, the marker: that literal, then more)
    error_event: Callable[[str, str, int | None], bytes]

    def ends_in(self, data: bytes | bytearray) -> bool:
        """Whether `data` holds one of this API's end markers."""
        for literal, marker in self.markers:  # noqa: SIM110 (any() of a generator: a frame more, on every read)
            if literal in data and marker.search(data) is not None:
                return True
        return False


def _marker(literal: bytes, then: bytes) -> tuple[bytes, re.Pattern[bytes]]:
    return literal, re.compile(re.escape(literal) + then)


def _chat_error(message: str, code: str, sequence: int | None) -> bytes:
    """openai-python raises `APIError` on any event whose payload has an `error` object."""
    return b"data: " + error_body(message, 502, code, type_="server_error") + b"\n\n"


def _responses_error(message: str, code: str, sequence: int | None) -> bytes:
    """The `error` event as documented (flat fields), with the `error` object the live API also sends.

    openai-python only raises on a payload's `error` object; with the flat fields alone,
    `responses.create(stream=True)` yields an ErrorEvent and the stream ends as if complete.
    """
    error = {"type": "server_error", "code": code, "message": message, "param": None}
    event = {
        "type": "error",
        "code": code,
        "message": message,
        "param": None,
        "sequence_number": 0 if sequence is None else sequence + 1,
        "error": error,
    }
    return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"


def _messages_error(message: str, code: str, sequence: int | None) -> bytes:
    """anthropic-python raises an `APIStatusError` on `event: error`."""
    return b"event: error\ndata: " + anthropic_error_body(message) + b"\n\n"


_ENDS = rb"(?:response\.(?:completed|failed|incomplete)|error)"
CHAT = StreamApi(
    "chat",
    (_marker(b'"finish_reason"', rb'\s*:\s*"'), _marker(b"[DONE]", rb"[\r\n]"), _marker(b'"error"', rb"\s*:\s*\{")),
    _chat_error,
)
RESPONSES = StreamApi(
    "responses",
    (_marker(b'"type"', rb'\s*:\s*"' + _ENDS + b'"'), _marker(b"event:", rb" ?" + _ENDS + rb"[\r\n]")),
    _responses_error,
)
MESSAGES = StreamApi(
    "messages",
    (_marker(b'"type"', rb'\s*:\s*"(?:message_stop|error)"'), _marker(b"event:", rb" ?(?:message_stop|error)[\r\n]")),
    _messages_error,
)
STREAM_APIS = {api.name: api for api in (CHAT, RESPONSES, MESSAGES)}

# Paths after /v1/ that stream one of these APIs when asked to (the passthrough route watches them too).
_PATHS = {"chat/completions": CHAT, "responses": RESPONSES, "messages": MESSAGES}


def api_for_path(method: str, tail: str) -> str | None:
    """The streaming API a `/v1/{tail}` request speaks, if it is one the relay knows how to watch."""
    api = _PATHS.get(tail.rstrip("/")) if method == "POST" else None
    return api.name if api is not None else None


class EndWatch:
    """Follows the bytes relayed on one stream: has its API's end marker gone by?"""

    def __init__(self, api: StreamApi) -> None:
        self.api = api
        self.ended = False
        self.sequence: int | None = None  # the last `sequence_number` relayed (Responses)
        self._carry = b""  # the last bytes of an event past the bound, so a marker split by a read is found
        self._in_long_event = False  # its marker went by, in the event past the bound being relayed

    def see(self, piece: Piece) -> None:
        """Relayed bytes, in order. A marker counts once its event is whole: a client acts on whole events only."""
        if piece.whole:
            self.see_whole(piece.data)
            return
        if self.api is RESPONSES:
            self._note_sequence(piece.data)
        if self.ended:
            return
        found = self.api.ends_in(self._carry + piece.data[:_CARRY]) or self.api.ends_in(piece.data)
        self._in_long_event = self._in_long_event or found
        self._carry = (self._carry + piece.data[-_CARRY:])[-_CARRY:]
        if piece.complete:
            self.ended, self._in_long_event, self._carry = self._in_long_event, False, b""

    def see_whole(self, data: bytes) -> None:
        """Whole events relayed (the usual read): `see` for them, without a `Piece`."""
        if self.api is RESPONSES:
            self._note_sequence(data)
        if not self.ended:
            self.ended = self.api.ends_in(data)

    def cut(self, cause: str, relayed: int) -> bytes:
        """Count and log a cut stream once (never its content); the error event to send the client."""
        STREAMS_CUT.inc(api=self.api.name, cause=cause)
        log.warning("upstream %s stream cut (%s) after %d bytes; the client is told so", self.api.name, cause, relayed)
        return self.api.error_event(_MESSAGES[cause], _CODES[cause], self.sequence)

    def _note_sequence(self, data: bytes) -> None:
        at = data.rfind(b'"sequence_number"')
        if at >= 0 and (match := _SEQUENCE.match(data, at)):
            self.sequence = int(match.group(1))
