"""SSE framing (proxy/shell/sse_framing.py) and end-of-stream markers (proxy/shell/stream_ends.py), without sockets."""

from __future__ import annotations

import orjson
import pytest

from proxy.shell.sse_framing import EVENT_END, SseEvents, event_around
from proxy.shell.stream_ends import CHAT, MESSAGES, RESPONSES, EndWatch, StreamApi, api_for_path
from tests.conftest import RECORDED_STREAMS
from tests.streams import STREAMS, end_index, split_events

RECORDING = RECORDED_STREAMS[sorted(RECORDED_STREAMS)[0]]


def feed(events: SseEvents, data: bytes, size: int) -> list:
    pieces = []
    for i in range(0, len(data), size):
        pieces += events.feed(data[i : i + size])
        assert events.held <= events.bound
    return pieces


@pytest.mark.parametrize("size", [1, 2, 3, 5, 17, 4096, 1 << 20])
@pytest.mark.parametrize("separator", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_events_come_out_whole_however_the_stream_is_read(size: int, separator: bytes) -> None:
    data = RECORDING.replace(b"\n\n", separator)
    events = SseEvents()
    pieces = feed(events, data + b"data: unfinished", size)
    assert all(p.whole and p.complete and p.data.endswith(separator) for p in pieces)
    assert b"".join(p.data for p in pieces) == data
    assert events.finish() == b"data: unfinished"


@pytest.mark.parametrize("size", [1, 7, 4096, 30_000])
def test_an_event_past_the_bound_is_relayed_as_it_comes_and_never_held(size: int) -> None:
    long_event = b'data: {"x":"' + b"a" * 50_000 + b'"}\n\n'
    data = b"data: 1\n\n" + long_event + b"data: 2\n\n"
    events = SseEvents(bound=1000)
    pieces = feed(events, data, size)
    assert b"".join(p.data for p in pieces) == data
    unread = [p for p in pieces if not p.whole]
    assert b"".join(p.data for p in unread) == long_event
    assert [p.complete for p in unread][-1] and not any(p.complete for p in unread[:-1])
    assert pieces[-1].whole and pieces[-1].data.endswith(b"data: 2\n\n")
    assert not events.unread and events.finish() == b""


@pytest.mark.parametrize("separator", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_the_end_of_an_event_past_the_bound_is_found_when_a_read_splits_it(separator: bytes) -> None:
    for split in range(1, len(separator)):
        events = SseEvents(bound=10)
        head = b"data: " + b"b" * 40
        pieces = events.feed(head + separator[:split]) + events.feed(separator[split:] + b"data: next" + separator)
        assert [p.whole for p in pieces] == [False, False, True]
        assert pieces[1].complete and pieces[2].data == b"data: next" + separator


@pytest.mark.parametrize("separator", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_the_event_around_a_byte_is_the_one_a_walk_over_every_event_finds(separator: bytes) -> None:
    data = RECORDING.replace(b"\n\n", separator)
    bounds, start = [], 0
    for match in EVENT_END.finditer(data):
        bounds.append((start, match.end()))
        start = match.end()
    assert len(bounds) > 10
    for first, end in bounds:
        for at in (first, (first + end) // 2, end - len(separator) - 1):
            assert event_around(data, at) == (first, end)


def watch_over(api: StreamApi, events: list[bytes], size: int = 1 << 20) -> EndWatch:
    """An EndWatch that saw `events` relayed through SseEvents in reads of `size` bytes."""
    watch, framing = EndWatch(api), SseEvents(bound=64)
    for piece in feed(framing, b"".join(events), size):
        watch.see(piece)
    return watch


APIS = {"chat": CHAT, "responses": RESPONSES, "messages": MESSAGES}
WHOLE = [(api, name) for api, streams in STREAMS.items() for name in streams]


@pytest.mark.parametrize("size", [3, 1 << 20])
@pytest.mark.parametrize(("api", "name"), WHOLE, ids=[f"{a}-{n[:24]}" for a, n in WHOLE])
def test_a_stream_has_ended_exactly_once_its_marker_event_is_whole(api: str, name: str, size: int) -> None:
    """Before the marker's event, nothing in the stream (content naming other markers included) ends it."""
    events = split_events(STREAMS[api][name])
    last = end_index(api, events)
    assert not watch_over(APIS[api], events[:last], size).ended
    assert not watch_over(APIS[api], [*events[:last], events[last][:-2]], size).ended  # its blank line missing
    assert watch_over(APIS[api], events[: last + 1], size).ended


CONTENT = 'the end: data: [DONE]\n\n"finish_reason":"stop" "type":"response.completed" event: message_stop\n\n'


@pytest.mark.parametrize("api", list(APIS))
def test_markers_written_inside_content_never_end_a_stream(api: str) -> None:
    payload = {"chat": {"choices": [{"delta": {"content": CONTENT}, "finish_reason": None}]}}.get(
        api, {"type": "content_block_delta", "delta": {"type": "text_delta", "text": CONTENT}}
    )
    event = b"data: " + orjson.dumps(payload) + b"\n\n"
    assert not watch_over(APIS[api], [event]).ended
    assert not watch_over(APIS[api], [event * 3], size=5).ended  # also as an event past the bound, in small reads


def test_an_upstream_error_event_ends_a_stream() -> None:
    assert watch_over(CHAT, [b'data: {"error": {"message": "overloaded"}}\n\n']).ended
    assert watch_over(RESPONSES, [b'event: error\ndata: {"type":"error","message":"x","sequence_number":3}\n\n']).ended
    assert watch_over(MESSAGES, [b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n']).ended


def test_the_responses_error_event_follows_the_last_sequence_number() -> None:
    events = split_events(STREAMS["responses"]["responses_text.sse"])[:5]
    watch = watch_over(RESPONSES, events)
    payload = orjson.loads(watch.cut("eof", 0).split(b"data: ", 1)[1])
    assert payload["sequence_number"] == 5 and payload["error"]["code"] == payload["code"] == "upstream_incomplete"


@pytest.mark.parametrize(
    ("method", "tail", "api"),
    [
        ("POST", "chat/completions", "chat"),
        ("POST", "responses", "responses"),
        ("POST", "messages", "messages"),
        ("POST", "messages/count_tokens", None),
        ("GET", "responses", None),
        ("POST", "embeddings", None),
    ],
)
def test_the_passthrough_route_watches_the_paths_that_stream_an_api(method: str, tail: str, api: str | None) -> None:
    assert api_for_path(method, tail) == api
