"""Log hygiene: nothing a client sends can forge a log line, and no client header value reaches a log.

aiohttp's protocol errors (a header line past 8,190 bytes, a control character in a header) carry the
offending bytes in the exception's message, so with an `Authorization` header the client's key.
`ClientTextFilter` replaces such a record's traceback with the error's class and status, and escapes
control characters in every message, so a `%0a` in a path cannot start a line of its own.
Running out of file descriptors is reported once per interval with a count (`AcceptFailures`),
not once per refused connection with a traceback.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
ACCEPT_REPORT_INTERVAL_S = 10.0

log = logging.getLogger("proxy.server")


def printable(text: str) -> str:
    """`text` with control characters (line breaks included) written as escapes."""
    return _CONTROL.sub(lambda m: _ESCAPES.get(m.group()) or f"\\u{ord(m.group()):04x}", text)


class ClientTextFilter(logging.Filter):
    """Escapes control characters in each message; drops the client's bytes from aiohttp's protocol errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = f"{record.getMessage()}: {type(exc).__name__} ({exc.code})"
            record.args, record.exc_info, record.exc_text = None, None, None
        message = record.getMessage()
        if _CONTROL.search(message):
            record.msg, record.args = printable(message), None
        return True


CLIENT_TEXT_FILTER = ClientTextFilter()


def guarded_logger(name: str) -> logging.Logger:
    """The logger `name` with the filter on it: for loggers that are handed what clients send."""
    logger = logging.getLogger(name)
    if CLIENT_TEXT_FILTER not in logger.filters:
        logger.addFilter(CLIENT_TEXT_FILTER)
    return logger


def guard_handlers(logger: logging.Logger) -> None:
    """Every record `logger`'s handlers write passes the filter, whichever logger it came from."""
    for handler in logger.handlers:
        if CLIENT_TEXT_FILTER not in handler.filters:
            handler.addFilter(CLIENT_TEXT_FILTER)


class AcceptFailures:
    """The loop's exception handler: `accept()` out of descriptors is counted and reported once per interval."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float = ACCEPT_REPORT_INTERVAL_S) -> None:
        self.loop, self.interval_s = loop, interval_s
        self.failed = 0
        self._report: asyncio.TimerHandle | None = None

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if not (isinstance(exc, OSError) and exc.errno in _OUT_OF_DESCRIPTORS):
            loop.default_exception_handler(context)
            return
        self.failed += 1
        if self._report is None:
            log.error("out of file descriptors (%s): connections are waiting to be accepted", exc.strerror)
            self._report = loop.call_later(self.interval_s, self._again)

    def _again(self) -> None:
        """One line per interval while accepts keep failing; quiet (and re-armed) once they stop."""
        self._report = None
        if self.failed:
            log.error("out of file descriptors: accept failed %d times in the last %gs", self.failed, self.interval_s)
            self.failed = 0
            self._report = self.loop.call_later(self.interval_s, self._again)
