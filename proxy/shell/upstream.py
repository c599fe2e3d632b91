"""The one way requests leave the proxy: a pooled client bound to the configured upstream.

The host always comes from `upstream.base_url`; a request contributes only the path
after `/v1`, its query string, its end-to-end headers and its body.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import ssl
import time
from collections.abc import AsyncIterable, Mapping

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from proxy.config.loader import ConfigHolder
from proxy.errors import UpstreamError
from proxy.metrics import METRICS
from proxy.shell.access import ADMIN_COOKIE

log = logging.getLogger("proxy.upstream")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Set by the proxy itself, never copied from the client. `content-encoding` too: aiohttp decodes a
# compressed request body as the proxy reads it, so every body goes upstream decoded.
_REQUEST_OWN = frozenset({"host", "content-length", "expect", "accept-encoding", "content-encoding"})

UPSTREAM_LATENCY = METRICS.histogram(
    "context_proxy_upstream_latency_seconds", "Time from sending a request upstream to its response headers", ["route"]
)


def end_to_end(headers: Mapping[str, str], also_drop: frozenset[str] = frozenset()) -> CIMultiDict[str]:
    """The headers a proxy may forward: hop-by-hop ones, and those `Connection` names, removed."""
    named = {t.strip().lower() for v in headers.getall("connection", ()) for t in v.split(",")}  # type: ignore[attr-defined]
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in named or lower in also_drop:
            continue
        out.add(name, value)
    return out


def _without_admin_cookie(headers: CIMultiDict[str]) -> None:
    """The proxy's admin cookie (`access.ADMIN_COOKIE`) taken out of the `Cookie` headers, the client's other
    cookies kept: a browser that opened the dashboard sends the admin token with every request to the proxy."""
    values = headers.getall("cookie", ())
    if not any(ADMIN_COOKIE in value for value in values):
        return
    headers.popall("cookie")
    for value in values:
        kept = [pair for pair in value.split(";") if pair.split("=", 1)[0].strip() != ADMIN_COOKIE and pair.strip()]
        if kept:
            headers.add("Cookie", ";".join(kept).strip())


def is_anthropic(tail: str, headers: Mapping[str, str]) -> bool:
    """A request for Anthropic's API: `/v1/messages` and what is under it, or any request naming `anthropic-version`."""
    return tail.split("?", 1)[0].split("/", 1)[0] == "messages" or "anthropic-version" in headers


@functools.lru_cache(maxsize=8)
def _parsed(base_url: str) -> URL:
    return URL(base_url)


@functools.lru_cache(maxsize=128)  # a few routes make most requests: the URL is built once for each
def _joined(base_url: str, tail: str, query_string: str) -> URL:
    base = _parsed(base_url)
    return URL.build(
        scheme=base.scheme,
        user=base.raw_user,
        password=base.raw_password,
        host=base.raw_host or "",
        port=base.explicit_port,
        path=base.raw_path.rstrip("/") + "/" + tail.lstrip("/"),
        query_string=query_string,
        encoded=True,
    )


@functools.lru_cache(maxsize=8)
def _timeout(connect_s: float, read_s: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=None, connect=connect_s, sock_read=read_s)


def unreachable_cause(exc: BaseException) -> str:
    """Why a request never got its answer's headers, in an operator's words (refused, DNS, TLS, reset)."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return f"DNS lookup failed ({exc.os_error.strerror or exc.os_error})"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return f"TLS certificate refused ({exc.certificate_error})"
    if isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError):
        return f"TLS handshake failed ({getattr(exc, 'reason', None) or exc})"
    cause = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    if isinstance(cause, ConnectionResetError) or getattr(cause, "errno", None) == errno.ECONNRESET:
        return "connection reset"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "connection closed before the answer's headers"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


_NO_USER_AGENT = ("User-Agent",)
# Told the client with an upstream's refusal to upgrade, besides its status (a client may wait or fall back by them).
_REFUSAL_HEADERS = ("Retry-After", "WWW-Authenticate", "Upgrade")


def websocket_refused(exc: aiohttp.WSServerHandshakeError) -> UpstreamError:
    """The upstream's refusal of a WebSocket upgrade, with its status: Codex falls back to HTTP at once on a 426,
    where a 502 (the proxy's own failure) makes it retry for seconds first. An answer that is no refusal (a 2xx or
    3xx that did not upgrade) is the upstream misbehaving: 502."""
    status = exc.status if 400 <= exc.status <= 599 else 502
    headers = {name: value for name in _REFUSAL_HEADERS if exc.headers and (value := exc.headers.get(name))}
    return UpstreamError(
        f"The upstream refused the WebSocket upgrade ({exc.status}).",
        status=status,
        code="websocket_refused",
        headers=headers if status != 502 else None,
    )


class Upstream:
    """One pooled `aiohttp.ClientSession` to the configured upstream; open with `start()`."""

    def __init__(self, holder: ConfigHolder) -> None:
        self.holder = holder
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            # Bytes are relayed as they are: a compressed passthrough body stays compressed. No cookie jar: one
            # shared by every client would send the cookies an upstream set for one with everyone's requests.
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, trust_env=False, cookie_jar=aiohttp.DummyCookieJar()
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def url_for(self, tail: str, query_string: str = "", *, anthropic: bool = False) -> URL:
        """`base_url` joined with the (raw, still-encoded) path after `/v1` (Anthropic's: its base, /v1, the path)."""
        settings = self.holder.settings
        return _joined(
            settings.anthropic.base_url.rstrip("/") + "/v1" if anthropic else settings.upstream.base_url,
            tail,
            query_string,
        )

    def headers_for(
        self, client_headers: Mapping[str, str], *, identity: bool, anthropic: bool = False
    ) -> CIMultiDict[str]:
        """End-to-end client headers, with the configured key in place of the client's if there is one."""
        headers = end_to_end(client_headers, _REQUEST_OWN)
        _without_admin_cookie(headers)
        settings = self.holder.settings
        key_env = settings.anthropic.api_key_env if anthropic else settings.upstream.api_key_env
        if key_env:
            for name in ("authorization", "api-key", "x-api-key"):
                headers.popall(name, None)
            key = os.environ.get(key_env, "")
            if not key:
                raise UpstreamError(
                    f"The proxy's upstream key variable {key_env} is not set.", code="upstream_key_missing"
                )
            headers["x-api-key" if anthropic else "Authorization"] = key if anthropic else f"Bearer {key}"
        accept = client_headers.get("accept-encoding")
        headers["Accept-Encoding"] = "identity" if identity or not accept else accept
        return headers

    async def websocket(
        self, tail: str, *, query_string: str, headers: Mapping[str, str]
    ) -> aiohttp.ClientWebSocketResponse:
        """A WebSocket to the upstream (Codex's WebSocket mode); the client's handshake headers stay behind."""
        if self._session is None:
            raise RuntimeError("Upstream.start() was not awaited")
        out = self.headers_for(headers, identity=True)
        for name in [n for n in out if n.lower().startswith("sec-websocket-")]:
            out.popall(name, None)
        config = self.holder.settings.upstream
        try:
            return await self._session.ws_connect(
                self.url_for(tail, query_string),
                headers=out,
                protocols=tuple(p.strip() for p in headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()),
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=config.connect_timeout_s),
                autoping=True,
                heartbeat=self.holder.settings.server.websocket_heartbeat_s,  # a dead upstream is found, and closed
                max_msg_size=0,
            )
        except aiohttp.WSServerHandshakeError as exc:
            raise websocket_refused(exc) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(
                f"The upstream could not be reached: {unreachable_cause(exc)}.", code="upstream_unreachable"
            ) from exc

    async def send(
        self,
        method: str,
        tail: str,
        *,
        query_string: str,
        headers: Mapping[str, str],
        body: bytes | AsyncIterable[bytes] | None,
        content_length: int | None = None,
        route: str,
        identity: bool = False,
        content_type: str | None = None,
    ) -> aiohttp.ClientResponse:
        """Send and return the response once its headers are in; the caller releases or closes it.

        `content_type`: in place of the client's (a rewritten body is JSON whatever the client said)."""
        if self._session is None:
            raise RuntimeError("Upstream.start() was not awaited")
        config = self.holder.settings.upstream
        anthropic = is_anthropic(tail, headers)
        out = self.headers_for(headers, identity=identity, anthropic=anthropic)
        if content_type is not None:
            out["Content-Type"] = content_type
        if isinstance(body, bytes):
            out["Content-Length"] = str(len(body))
        elif body is not None and content_length is not None:
            out["Content-Length"] = str(content_length)
        timeout = _timeout(config.connect_timeout_s, config.read_timeout_s)
        url = self.url_for(tail, query_string, anthropic=anthropic)
        started = time.monotonic()
        try:
            response = await self._session.request(
                method,
                url,
                headers=out,
                data=body,
                timeout=timeout,
                allow_redirects=False,
                # No aiohttp User-Agent in place of a client's missing one (skipping costs a header copy: only then).
                skip_auto_headers=None if "User-Agent" in out else _NO_USER_AGENT,
            )
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            log.warning("upstream %s timed out before answering (%s)", url.path, type(exc).__name__)
            raise UpstreamError("The upstream did not answer in time.", status=504, code="upstream_timeout") from exc
        except (aiohttp.ClientError, OSError) as exc:
            where, why = f"{url.host}:{url.port}", unreachable_cause(exc)
            log.warning("upstream %s unreachable for %s: %s", where, url.path, why)
            raise UpstreamError(
                f"The upstream {where} could not be reached: {why}.", code="upstream_unreachable"
            ) from exc
        UPSTREAM_LATENCY.observe(time.monotonic() - started, route=route)
        return response
