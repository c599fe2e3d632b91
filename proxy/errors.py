"""The one way the proxy answers with an error of its own: OpenAI's error shape."""

from __future__ import annotations

import orjson
from aiohttp import web

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


def error_body(
    message: str, status: int = 400, code: str | None = None, param: str | None = None, type_: str | None = None
) -> bytes:
    kind = type_ or _TYPES.get(status, "api_error")
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


def error_response(
    status: int,
    message: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict | None = None,
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
