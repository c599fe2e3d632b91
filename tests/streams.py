"""Whole streams of each API for the stream tests: chat's recordings and the written Responses and Messages ones."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from proxy.shell.sse_framing import EVENT_END
from tests.conftest import RECORDED_STREAMS
from tests.harness import Rig, start_rig

DATA = Path(__file__).parent / "data" / "streams"
STREAMS: dict[str, dict[str, bytes]] = {
    "chat": RECORDED_STREAMS,
    "responses": {p.name: p.read_bytes() for p in sorted(DATA.glob("responses_*.sse"))},
    "messages": {p.name: p.read_bytes() for p in sorted(DATA.glob("messages_*.sse"))},
}
_MARKERS = {
    "chat": b'"finish_reason":"',
    "responses": b"event: response.completed\n",
    "messages": b"event: message_stop\n",
}


def split_events(data: bytes) -> list[bytes]:
    """Each event with its blank line."""
    events, start = [], 0
    for match in EVENT_END.finditer(data):
        events.append(data[start : match.end()])
        start = match.end()
    assert start == len(data), "the streams end with a blank line"
    return events


def end_index(api: str, events: list[bytes]) -> int:
    """The first event carrying the API's end marker: a cut before it is a cut stream."""
    return next(i for i, e in enumerate(events) if _MARKERS[api] in e)


async def rig_before(answer: Callable[[web.Request], Awaitable[web.StreamResponse]], **rig: Any) -> Rig:
    """A proxy in front of an aiohttp upstream answering every POST with `answer`; `rig.close()` stops both."""
    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    proxy = await start_rig(upstream_url=f"http://127.0.0.1:{runner.addresses[0][1]}/v1", **rig)
    proxy.extra.append(runner)
    return proxy
