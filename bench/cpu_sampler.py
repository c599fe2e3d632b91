"""A CPU-time stack sampler for a benchmark server: which feature each sampled microsecond of CPU belongs to.

pyinstrument's low-level hook calls us every `interval` seconds of wall time; samples of the loop
waiting in `epoll` are dropped, so what is kept is the main thread at work (or descheduled while at
work, on a loaded machine: the shares hold, the absolute figures are scaled to /proc's CPU time).
Each sample is charged to a *feature* (the outermost proxy function on the stack below the request
handler, e.g. `shell/relay.relay`) and a *place* (the innermost proxy function, or the library the
leaf frame is in). `python -m bench request-profile` reads what `dump()` writes at the server's exit.
"""

from __future__ import annotations

import contextvars
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

_PROXY = "/proxy/"
_BENCH = "/bench/"
# Frames the request passes through on its way to a handler: not features of their own.
_WRAPPERS = {"_observed", "__call__", "handler", "rewrite", "_handle", "forward"}
_IDLE = {"epoll.poll", "select", "poll.poll"}
_LIBRARIES = (
    ("aiohttp/web_protocol", "aiohttp server (protocol)"),
    ("aiohttp/_http_parser", "aiohttp parser"),
    ("aiohttp/http_parser", "aiohttp parser"),
    ("aiohttp/web_request", "aiohttp server (request)"),
    ("aiohttp/web_response", "aiohttp server (response)"),
    ("aiohttp/web_urldispatcher", "aiohttp router"),
    ("aiohttp/web_app", "aiohttp server (app, middlewares)"),
    ("aiohttp/http_writer", "aiohttp writer"),
    ("aiohttp/_http_writer", "aiohttp writer"),
    ("aiohttp/client", "aiohttp client"),
    ("aiohttp/connector", "aiohttp client (pool)"),
    ("aiohttp/streams", "aiohttp streams"),
    ("aiohttp/", "aiohttp (other)"),
    ("multidict", "multidict"),
    ("yarl", "yarl"),
    ("asyncio/selector_events", "asyncio transports"),
    ("asyncio/", "asyncio loop"),
    ("selectors", "asyncio loop"),
    ("orjson", "orjson"),
    ("tiktoken", "tiktoken"),
    ("logging/", "logging"),
)


def _library(filename: str) -> str:
    for fragment, name in _LIBRARIES:
        if fragment in filename:
            return name
    return "python (other)"


def _proxy_name(code: Any) -> str | None:
    filename = code.co_filename
    at = filename.rfind(_PROXY)
    if at < 0:
        return None
    module = filename[at + len(_PROXY) :].removesuffix(".py")
    return f"{module}.{code.co_name}"


class CpuSampler:
    """Charges each sample's CPU time to (feature, place); see the module docstring."""

    def __init__(self, interval: float = 0.0002) -> None:
        self.interval = interval
        self.seconds: Counter[tuple[str, str, str]] = Counter()
        self._last = 0.0
        self._started_cpu = 0.0
        self._context: contextvars.ContextVar[Any] = contextvars.ContextVar(
            "cpu_sampler", default=None
        )  # the hook keeps no ref

    def start(self) -> None:
        from pyinstrument.low_level.stat_profile import setstatprofile

        self._last = time.perf_counter()
        self._started_cpu = time.thread_time()
        setstatprofile(self._sample, self.interval, self._context, "walltime")

    def stop(self) -> None:
        from pyinstrument.low_level.stat_profile import setstatprofile

        setstatprofile(None)

    def _sample(self, frame: FrameType, event: str, arg: Any) -> None:
        now = time.perf_counter()
        elapsed, self._last = now - self._last, now
        if event == "c_call" and getattr(arg, "__qualname__", "") in _IDLE:
            return  # the loop waiting for sockets: not work
        place = feature = None
        f: FrameType | None = frame
        while f is not None:
            name = _proxy_name(f.f_code)
            if name is not None:
                place = place or name
                if f.f_code.co_name not in _WRAPPERS:
                    feature = name
            f = f.f_back
        if event in ("c_call", "c_return") and getattr(arg, "__module__", None):
            leaf = _library(str(arg.__module__).replace(".", "/") + "/")
            if leaf == "python (other)":
                leaf = _library(frame.f_code.co_filename)
        else:
            leaf = _library(frame.f_code.co_filename) if _proxy_name(frame.f_code) is None else "proxy code"
        self.seconds[(feature or "(outside the proxy)", place or "-", leaf)] += elapsed

    def dump(self, path: Path, **extra: Any) -> None:
        total = time.thread_time() - self._started_cpu
        rows = [[feature, place, leaf, s] for (feature, place, leaf), s in self.seconds.most_common()]
        path.write_bytes(orjson.dumps({"thread_cpu_s": total, "rows": rows, **extra}))
