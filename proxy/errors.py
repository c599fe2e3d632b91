"""The proxy's own errors: one base that knows its status and body, answered in one place (server.observe).

Every error the proxy returns itself has OpenAI's shape unless the route's API has its own
(a dialect's `error_body`); upstream errors are relayed as the upstream sent them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import orjson
from aiohttp import web

# An API's error body: (message, status, code, param) -> bytes.
ErrorShape = Callable[[str, int, "str | None", "str | None"], bytes]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ProxyError(Exception):
    """An answer the proxy gives itself instead of forwarding: raise it anywhere on a request's path."""

    status = 500
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status if status is not None else type(self).status
        self.code = code if code is not None else self.default_code
        self.param = param
        self.headers = dict(headers or {})

    def response(self, shape: ErrorShape | None = None) -> web.Response:
        """The answer, in OpenAI's shape or the route's API's own (`shape`, a dialect's `error_body`)."""
        body = (shape or error_body)(self.message, self.status, self.code, self.param)
        return web.Response(
            status=self.status, body=body, content_type="application/json", headers=self.headers or None
        )


class InvalidRequest(ProxyError):
    """A body the proxy refuses, with the OpenAI-style `param` and `code` it names."""

    status = 400

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message, code=code, param=param)


class BodyTooLarge(ProxyError):
    """The request body passed `server.max_body_mb`."""

    status = 413
    default_code = "request_too_large"


class UpstreamError(ProxyError):
    """The upstream could not give us response headers: 502, or 504 on a time-out."""

    status = 502


class ContextOverflow(ProxyError):
    """The engine knows the upstream would refuse this request as too long (policy `error`, or nothing fits)."""

    status = 400
    default_code = "context_length_exceeded"


def error_body(
    message: str, status: int = 400, code: str | None = None, param: str | None = None, type_: str | None = None
) -> bytes:
    kind = type_ or _TYPES.get(status, "api_error")
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


def anthropic_error_body(message: str, error_type: str = "api_error") -> bytes:
    """Anthropic's error JSON, as a response body or an `error` event's data."""
    return orjson.dumps({"type": "error", "error": {"type": error_type, "message": message}})


def error_response(
    status: int,
    message: str,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
    type_: str | None = None,
) -> web.Response:
    """A JSON error response shaped like OpenAI's, so SDKs raise their usual exceptions.

    `type_` defaults to OpenAI's type for the status; the simulator names the API's exact one.
    """
    return web.Response(
        status=status,
        body=error_body(message, status, code, param, type_),
        content_type="application/json",
        headers=headers,
    )
