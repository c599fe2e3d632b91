"""Reading a client's body within `server.max_body_mb`: refused as soon as it passes, never read beyond."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from proxy.config import Settings
from proxy.errors import BodyTooLarge


def max_body(settings: Settings) -> int:
    return int(settings.server.max_body_mb * 1024 * 1024)


def too_large(settings: Settings) -> BodyTooLarge:
    return BodyTooLarge(f"Request body too large: the limit is {settings.server.max_body_mb:g} MB.")


async def read_body(request: web.Request, settings: Settings) -> bytes:
    """The whole body, refused as soon as it passes the limit (declared or counted), never read beyond it."""
    limit = max_body(settings)
    if request.content_length is not None and request.content_length > limit:
        raise too_large(settings)
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise too_large(settings)
    return bytes(body)


class StreamedBody:
    """The client's body as it arrives, for the upstream to read; counts it against the limit."""

    def __init__(self, request: web.Request, settings: Settings) -> None:
        self.request, self.settings = request, settings
        self.too_large: BodyTooLarge | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total, limit = 0, max_body(self.settings)
        async for chunk in self.request.content.iter_any():
            total += len(chunk)
            if total > limit:
                self.too_large = too_large(self.settings)
                raise self.too_large
            yield chunk
