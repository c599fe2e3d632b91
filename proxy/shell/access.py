"""Who may use the proxy, and what a client may not smuggle through it.

Access keys come from `[auth] keys_env` (comma-separated, read per request so a rotated
key takes effect without a restart). A client presents one as `Authorization: Bearer`, as
`x-api-key` (Anthropic's SDKs and Claude Code send their key so) or, when its own credential
is an upstream key, as `X-Proxy-Key`. A proxy key is never forwarded: the header that
carried it is removed (the upstream gets the configured key, or none). `/healthz`, `/metrics` and
`/sessions` are not gated by proxy keys: the admin routes (`/metrics`, `/sessions`, `/stats`, `/dashboard`)
answer `admin_denied` (an admin token, or loopback clients only). A browser presents the token as the
`ADMIN_COOKIE` the dashboard sets (`shell/dashboard.py`), any other client as `Authorization: Bearer`.
"""

from __future__ import annotations

import hmac
import ipaddress
import itertools
import os
import re
from collections.abc import Awaitable, Callable

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.config.loader import ConfigHolder
from proxy.config.settings import Settings
from proxy.errors import InvalidRequest, ProxyError, error_response

PROXY_KEY_HEADER = "X-Proxy-Key"
ADMIN_COOKIE = "context_proxy_admin"  # the admin token as a browser holds it (HttpOnly, SameSite=Strict)
GATED_PREFIXES = ("/v1/", "/s/")
_LINE_BREAK = re.compile(r"[\r\n\x00]")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# A request's headers (aiohttp's read-only view) or a copy being edited.
Headers = CIMultiDict[str] | CIMultiDictProxy[str]


# Where the middleware leaves the proxy key a client presented, for the session fingerprint:
# with access keys on, the key may be stripped before the chat handler reads the headers.
CLIENT_CREDENTIAL = web.RequestKey("client_credential", str)


def access_keys(settings: Settings) -> tuple[str, ...]:
    """The proxy access keys in force; empty means the proxy is open."""
    env = settings.auth.keys_env
    if not env:
        return ()
    return tuple(k.strip() for k in os.environ.get(env, "").split(",") if k.strip())


def _authorization(headers: Headers) -> tuple[bool, str]:
    """Whether `Authorization` uses the Bearer scheme, and its credential (the whole value if not)."""
    value = headers.get("Authorization", "")
    if value[:7].lower() == "bearer ":
        return True, value[7:].strip()
    return False, value.strip()


def authorization_token(headers: Headers) -> str:
    """The client's credential as sent: the Bearer token, or a bare `Authorization` value."""
    return _authorization(headers)[1]


def _bearer(headers: Headers) -> str:
    """A Bearer token only: a bare `Authorization` value is no proxy key."""
    is_bearer, token = _authorization(headers)
    return token if is_bearer else ""


def _presented_key(headers: Headers, keys: tuple[str, ...]) -> tuple[str, list[str]]:
    """The proxy key a client presents and the headers that carry it; ("", []) when it presents none.

    `X-Proxy-Key` when sent (the client's other credentials are then its own); else its Bearer token or
    its `x-api-key`, whichever is one of `keys`.
    """
    explicit = headers.get(PROXY_KEY_HEADER)
    if explicit is not None:
        return (explicit.strip(), [PROXY_KEY_HEADER]) if _matches(explicit.strip(), keys) else ("", [])
    held = {"Authorization": _bearer(headers).strip(), "x-api-key": headers.get("x-api-key", "").strip()}
    key = next((value for value in held.values() if _matches(value, keys)), "")
    return key, [name for name, value in held.items() if key and value == key]


def is_loopback(host: str | None) -> bool:
    """A loopback address (or `localhost`), as a bind host or a client's remote address."""
    if host is None:
        return False
    try:
        return host == "localhost" or ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _matches(presented: str, keys: tuple[str, ...]) -> bool:
    """Constant-time over every key, so timing says nothing about which one nearly matched."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(presented.encode(), key.encode())
    return found and bool(presented)


def _is_utf8(text: str) -> bool:
    """aiohttp keeps a byte that is not UTF-8 as a lone surrogate: such text has no bytes to compare or forward."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def unsafe_header(headers: Headers) -> tuple[str, str] | None:
    """The first header whose name or value holds CR, LF or NUL (it could split a forwarded header) or a byte that
    is not UTF-8, and what is wrong with it."""
    joined = "".join(itertools.chain.from_iterable(headers.items()))  # one search and one encode for them all
    if _LINE_BREAK.search(joined) is None and _is_utf8(joined):
        return None
    for name, value in headers.items():
        if _LINE_BREAK.search(name) or _LINE_BREAK.search(value):
            return name, "contains a line break"
        if not (_is_utf8(name) and _is_utf8(value)):
            return name.encode(errors="backslashreplace").decode(), "is not valid UTF-8"
    return None


def exposure_problem(host: str, settings: Settings) -> str | None:
    """Why binding `host` is unsafe: off loopback, /sessions and /metrics need `server.admin_token_env` set."""
    env = settings.server.admin_token_env
    if is_loopback(host) or (env and os.environ.get(env)):
        return None
    return f"binding {host} exposes /sessions and /metrics: set [server] admin_token_env to a variable holding a token"


def check_request(request: web.Request, settings: Settings) -> ProxyError | tuple[CIMultiDict[str], str] | None:
    """A refusal (answered in the route's API's shape), or the headers to continue with (the proxy key removed) and
    the key presented, or None to continue unchanged."""
    if (unsafe := unsafe_header(request.headers)) is not None:
        name, problem = unsafe
        return InvalidRequest(f"Header {name[:40]!r} {problem}.", None, "invalid_header")
    if not request.path.startswith(GATED_PREFIXES):
        return None
    keys = access_keys(settings)
    if not keys:
        return (_without(request.headers, PROXY_KEY_HEADER), "") if PROXY_KEY_HEADER in request.headers else None
    key, carriers = _presented_key(request.headers, keys)
    if not key:
        return ProxyError(
            f"This proxy needs an access key: send it as 'Authorization: Bearer <key>', 'x-api-key' or "
            f"'{PROXY_KEY_HEADER}'.",
            status=401,
            code="invalid_proxy_key",
        )
    return _without(request.headers, *carriers), key  # the proxy key is not the upstream's credential


def admin_token(settings: Settings) -> str | None:
    """The admin token in force: None when none is configured (loopback clients only), "" when its variable is unset."""
    env = settings.server.admin_token_env
    return os.environ.get(env, "") if env else None


def is_admin_token(presented: str, settings: Settings) -> bool:
    token = admin_token(settings)
    return bool(token) and hmac.compare_digest(presented.encode(), str(token).encode())


def admin_denied(request: web.Request, settings: Settings) -> web.Response | None:
    """The admin routes: the admin token (as a Bearer token, or the dashboard's cookie) when configured, else
    loopback clients only."""
    if admin_token(settings) is not None:
        presented = (authorization_token(request.headers), request.cookies.get(ADMIN_COOKIE, ""))
        if any(is_admin_token(value, settings) for value in presented):
            return None
        return error_response(401, "This route needs the proxy's admin token.", "invalid_admin_token")
    if is_loopback(request.remote):
        return None
    return error_response(403, "This route is only served to loopback clients.", "admin_loopback_only")


def _without(headers: Headers, *names: str) -> CIMultiDict[str]:
    out = CIMultiDict(headers)
    for name in names:
        out.popall(name, None)
    return out


class AccessMiddleware:
    """The aiohttp middleware: install it after server.py's `observe`, so refusals are counted.

    A callable object rather than a `@web.middleware` function: aiohttp 3 reads the marker below,
    aiohttp 4 takes any such callable (and deprecates the decorator).
    """

    __middleware_version__ = 1

    def __init__(self, holder: ConfigHolder) -> None:
        self.holder = holder

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        verdict = check_request(request, self.holder.settings)
        if isinstance(verdict, ProxyError):
            raise verdict
        if verdict is not None:
            headers, presented = verdict
            request = request.clone(headers=headers)
            if presented:
                request[CLIENT_CREDENTIAL] = presented  # sessions are scoped by who the client is
        return await handler(request)
