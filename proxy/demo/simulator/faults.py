"""How the simulator's bytes leave, and how they fail: pacing, piece sizes and the `X-Sim-Fault` faults.

Every request is recorded first (its body counted as it arrives); then a fault before headers
is played, or the handler answers and `send` writes its body piece by piece, where the
mid-stream faults strike. A client that leaves is counted in `totals.disconnects`.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.demo.simulator.answers import openai_error
from proxy.demo.simulator.model import SIMULATOR, RecordedRequest, Simulator

BODY: web.RequestKey[Any] = web.RequestKey("sim_body")  # the request's parsed JSON, or None

MID_STREAM_FAULTS = frozenset({"reset-mid-stream", "silence-mid-stream", "malformed-sse"})
# fault -> (status, message, type, code, extra headers): the real API's bodies for these statuses.
STATUS_FAULTS: dict[str, tuple[int, str, str, str | None, dict[str, str]]] = {
    "status-401": (401, "Incorrect API key provided: sk-sim.", "invalid_request_error", "invalid_api_key", {}),
    "status-429": (429, "Rate limit reached for requests.", "requests", "rate_limit_exceeded",
                   {"retry-after": "1", "x-ratelimit-remaining-requests": "0"}),
    "status-500": (500, "The server had an error while processing your request. Sorry about that!", "server_error",
                   None, {}),
    "status-503": (503, "The engine is currently overloaded, please try again later.", "server_error", None, {}),
}  # fmt: skip
BAD_GATEWAY = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n</body>\r\n</html>\r\n"  # noqa: E501
FAULTS = (
    frozenset({"reset-before-headers", "silence", "slow-headers", "non-json-error", *STATUS_FAULTS}) | MID_STREAM_FAULTS
)


async def wait_while_connected(request: web.BaseRequest, seconds: float) -> None:
    """Sleep `seconds`; raise ConnectionResetError as soon as the client hangs up."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while (left := end - loop.time()) > 0:
        if request.transport is None or request.transport.is_closing():
            raise ConnectionResetError("the client left")
        await asyncio.sleep(min(left, 0.02))


def number_header(request: web.BaseRequest, name: str, default: float) -> float:
    try:
        return float(request.headers.get(name, default))
    except ValueError:
        return default


def piece_sizes(request: web.BaseRequest) -> list[int] | None:
    """X-Sim-Piece-Bytes as a list of positive sizes; None without the header; ValueError if malformed."""
    header = request.headers.get("X-Sim-Piece-Bytes")
    if header is None:
        return None
    sizes = [int(size) for size in header.split(",")]
    if not sizes or min(sizes) < 1:
        raise ValueError(header)
    return sizes


def _header_problem(request: web.BaseRequest) -> str | None:
    fault = request.headers.get("X-Sim-Fault", "")
    if fault and fault not in FAULTS:
        return f"unknown X-Sim-Fault {fault!r}; known: {sorted(FAULTS)}"
    try:
        piece_sizes(request)
    except ValueError:
        return f"X-Sim-Piece-Bytes must be positive integers, comma separated: {request.headers['X-Sim-Piece-Bytes']!r}"
    return None


async def _record(request: web.Request, sim: Simulator) -> None:
    chunks = []
    async for chunk in request.content.iter_any():
        sim.body_bytes += len(chunk)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        body = None
    request[BODY] = body
    sim.requests.append(RecordedRequest(request.method, request.raw_path, CIMultiDict(request.headers), raw, body))


@web.middleware
async def record_and_fault(request: web.Request, handler: Any) -> web.StreamResponse:
    """Record every request, then play the fault its `X-Sim-Fault` header asks for before any headers."""
    sim = request.app[SIMULATOR]
    try:
        await _record(request, sim)
        if problem := _header_problem(request):
            return openai_error(400, problem, "invalid_request_error")
        fault = request.headers.get("X-Sim-Fault", "")
        if fault == "slow-headers":
            await wait_while_connected(request, sim.config.slow_headers_s)
        elif fault == "silence":
            await wait_while_connected(request, sim.config.silence_s)
            return web.Response(status=204)
        elif fault == "reset-before-headers":
            _reset(request)
            return web.Response(status=204)
        elif fault == "non-json-error":
            return web.Response(status=502, text=BAD_GATEWAY, content_type="text/html")
        elif fault in STATUS_FAULTS:
            status, message, type_, code, headers = STATUS_FAULTS[fault]
            return openai_error(status, message, type_, code, headers=headers)
        return await handler(request)
    except (ConnectionError, asyncio.CancelledError):
        sim.totals.disconnects += 1
        raise


def _reset(request: web.BaseRequest, hard: bool = True) -> None:
    """Drop the connection: RST before headers; mid-body a plain close, so the bytes sent arrive first."""
    if request.transport is not None:
        request.transport.abort() if hard else request.transport.close()


def response_headers(sim: Simulator) -> dict[str, str]:
    return {"x-request-id": f"req_sim{sim.next_id():08d}", "openai-processing-ms": "1", "openai-version": "2020-10-01"}


async def send_json(request: web.Request, payload: Any) -> web.StreamResponse:
    """A JSON answer, sent in two halves so the mid-stream faults can break it between them."""
    data = orjson.dumps(payload)
    return await send(request, [data[: len(data) // 2], data[len(data) // 2 :]], "application/json", 1, 0.0)


def _recut(pieces: list[bytes], sizes: list[int]) -> list[bytes]:
    data, out, at, next_size = b"".join(pieces), [], 0, itertools.cycle(sizes)
    while at < len(data):
        size = next(next_size)
        out.append(data[at : at + size])
        at += size
    return out


async def send(
    request: web.Request, pieces: list[bytes], content_type: str, fault_at: int, delay: float
) -> web.StreamResponse:
    """Write the body piece by piece, paced by `delay`; the mid-stream faults strike before piece `fault_at`."""
    sim, fault = request.app[SIMULATOR], request.headers.get("X-Sim-Fault", "")
    sse = content_type == "text/event-stream"
    if fault == "malformed-sse" and fault_at < len(pieces):
        pieces[fault_at] = pieces[fault_at][: len(pieces[fault_at]) // 2] + (b"\n\n" if sse else b"")
    if sizes := piece_sizes(request):
        pieces = _recut(pieces, sizes)
    response = web.StreamResponse(headers=response_headers(sim))
    response.content_type, response.charset = content_type, "utf-8"
    if not sse:
        response.content_length = sum(map(len, pieces))
    await response.prepare(request)
    sim.active_streams += 1
    try:
        for i, piece in enumerate(pieces):
            if i == fault_at and fault == "reset-mid-stream":
                _reset(request, hard=False)
                return response
            if i == fault_at and fault == "silence-mid-stream":
                await wait_while_connected(request, sim.config.silence_s)
            if i and delay > 0:
                await wait_while_connected(request, delay)
            await response.write(piece)
        await response.write_eof()
    finally:
        sim.active_streams -= 1
    return response
