"""`context-proxy demo`: a real agent trace replayed against a 32k-window upstream, direct and through the proxy.

Everything runs on 127.0.0.1: the simulator plays the upstream (it bills prompt and
cached tokens and refuses requests over the window), the proxy sits in front of it,
and a plain HTTP client sends the agent's requests turn by turn, as the `openai` SDK would (streamed,
usage requested). No key, no network, nothing beyond the runtime dependencies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from proxy.config.loader import ConfigHolder, load_settings
from proxy.context.policy import ModelInfo
from proxy.demo.simulator import SIMULATOR, SimulatorConfig, start_simulator
from proxy.demo.traces import Trace, list_traces, load_trace, requests
from proxy.demo.traces_messages import messages_requests
from proxy.demo.traces_responses import responses_requests

DEFAULT_TRACE = "mini_django-11138.tools.json"
DEFAULT_MODEL = "sim-32k"
DEFAULT_MODELS = {"chat": DEFAULT_MODEL, "responses": DEFAULT_MODEL, "messages": "claude-sim-32k"}


@dataclass
class ReplayResult:
    """One replay of a trace: what the client saw and what the upstream billed."""

    label: str
    turns: int = 0
    failed: int = 0  # refused with context_length_exceeded
    first_failure: int | None = None
    usage: list[tuple[int, int] | None] = field(default_factory=list)  # per turn: (prompt, cached); None = refused
    last_headers: dict[str, str] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return sum(u[0] for u in self.usage if u)

    @property
    def cached_tokens(self) -> int:
        return sum(u[1] for u in self.usage if u)

    def billed_input(self, model: ModelInfo, turns: int | None = None) -> float:
        """USD for the prompt tokens of the first `turns` turns: uncached at the input price, cached at the cached."""
        used = [u for u in self.usage[:turns] if u]
        prompt, cached = sum(u[0] for u in used), sum(u[1] for u in used)
        return ((prompt - cached) * model.input_per_mtok + cached * model.cached_input_per_mtok) / 1e6


def _bodies(trace: Trace, model: str, api: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each request the agent sent, streamed: as chat completions, as Codex sends Responses, or as Claude Code
    sends Messages (`--api`)."""
    if api == "messages":
        for body in messages_requests(trace, model):
            yield "messages", {**body, "stream": True}
        return
    if api == "responses":
        for body in responses_requests(trace, model):
            yield "responses", {**body, "stream": True}
        return
    extra: dict[str, Any] = {"tools": trace.tools} if trace.tools else {}
    for messages, _answer in requests(trace):
        body = {"model": model, "messages": messages, "stream": True, "stream_options": {"include_usage": True}}
        yield "chat/completions", {**body, **extra}


Progress = Callable[[str, int, int], None]  # (label, turns sent, turns in all)


async def replay(
    base_url: str,
    trace: Trace,
    model: str,
    label: str,
    max_turns: int | None = None,
    api: str = "chat",
    progress: Progress | None = None,
) -> ReplayResult:
    """Send each of the trace's requests as the agent did (streamed, usage requested) and tally the outcome."""
    result = ReplayResult(label)
    total = sum(1 for _ in requests(trace))
    total = total if max_turns is None else min(total, max_turns)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, headers={"Authorization": "Bearer demo"}) as http:
        for turn, (path, body) in enumerate(_bodies(trace, model, api), start=1):
            if max_turns is not None and turn > max_turns:
                break
            result.turns += 1
            async with http.post(f"{base_url}/{path}", data=orjson.dumps(body)) as response:
                usage = None
                if response.status != 200:
                    _refused_for_window(response.status, await response.read())
                else:
                    result.last_headers = {
                        _title(k): v for k, v in response.headers.items() if k.lower().startswith("x-context-")
                    }
                    usage = await _streamed_usage(response)
                if usage is None:
                    result.failed += 1
                    result.first_failure = result.first_failure or turn
                result.usage.append(usage)
            if progress is not None:
                progress(label, turn, total)
    return result


def print_progress(label: str, sent: int, total: int) -> None:
    """The replay as it goes, on stderr: one line redrawn on a terminal, else a line every 25 turns."""
    if sys.stderr.isatty():
        end = "\n" if sent == total else ""
        print(f"\r  {label}: turn {sent}/{total}", end=end, file=sys.stderr, flush=True)
    elif sent == total or sent % 25 == 0:
        print(f"  {label}: turn {sent}/{total}", file=sys.stderr, flush=True)


def _refused_for_window(status: int, body: bytes) -> None:
    """A refusal the replay counts (`context_length_exceeded`); anything else stops the demo with its message."""
    try:
        error = orjson.loads(body).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        error = {}
    too_long = error.get("code") == "context_length_exceeded" or str(error.get("message")).startswith(
        "prompt is too long"
    )
    if status != 400 or not too_long:
        raise RuntimeError(f"upstream answered {status}: {error.get('message') or body[:200]!r}")


async def _streamed_usage(response: aiohttp.ClientResponse) -> tuple[int, int] | None:
    """(prompt, cached) tokens from the stream's usage (chat's usage chunk, Responses' `response.completed`);
    (0, 0) if it sent none; None when a Responses stream was refused for length (`response.failed`)."""
    usage: dict[str, Any] = {}
    async for line in response.content:
        if line.startswith(b"data: {"):
            event = orjson.loads(line[6:])
            if event.get("type") == "response.failed":
                _refused_for_window(400, orjson.dumps(event["response"]))
                return None
            usage = event.get("usage") or (event.get("response") or {}).get("usage") or usage
    if "cache_read_input_tokens" in usage:  # Messages: input_tokens is only what the cache neither read nor wrote
        read = usage["cache_read_input_tokens"] or 0
        return usage.get("input_tokens", 0) + (usage.get("cache_creation_input_tokens") or 0) + read, read
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    return usage.get("prompt_tokens", usage.get("input_tokens", 0)), details.get("cached_tokens") or 0


def _title(header: str) -> str:
    return "-".join(part.capitalize() for part in header.split("-"))


def _row(name: str, direct: Any, proxied: Any) -> str:
    def cell(value: Any) -> str:
        if value is None:
            return "-"
        return f"{value:,}" if isinstance(value, int) else str(value)

    return f"  {name:<28}{cell(direct):>14}{cell(proxied):>14}"


def render(trace: Trace, model: str, info: ModelInfo, results: list[ReplayResult]) -> str:
    """The demo's table: one column per replay."""
    lines = [
        f"trace {trace.name}: {trace.turns} turns ({trace.format or 'agent'}; {trace.source.split(':')[0]})",
        f"model {model}: window {info.context_window:,} tokens; input ${info.input_per_mtok:.2f}, "
        f"cached input ${info.cached_input_per_mtok:.2f} per million tokens",
        "",
        "  " + " " * 28 + "".join(f"{r.label:>14}" for r in results),
    ]
    rows: list[tuple[str, list[Any]]] = [
        ("turns sent", [r.turns for r in results]),
        ("turns failed (window)", [r.failed for r in results]),
        ("first failed turn", [r.first_failure for r in results]),
        ("prompt tokens billed", [r.prompt_tokens for r in results]),
        ("cached tokens", [r.cached_tokens for r in results]),
    ]
    both = min((r.first_failure or r.turns + 1) - 1 for r in results)
    if both < max(r.turns for r in results):  # the like-for-like comparison: the turns every replay answered
        rows.append((f"input $, same turns 1-{both}", [f"${r.billed_input(info, both):.4f}" for r in results]))
    answered = [f"${r.billed_input(info):.4f} ({r.turns - r.failed})" for r in results]
    rows.append(("input $, turns it answered", answered))  # with their count: no like-for-like comparison
    lines += [_row(name, *values) for name, values in rows]
    lines.append("  (a refused turn is not billed: compare the same turns; a real agent stops at its first refusal)")
    headers = results[-1].last_headers
    if headers:
        lines += ["", "last turn through the proxy:"] + [f"  {k}: {v}" for k, v in sorted(headers.items())]
    return "\n".join(lines)


async def run_demo(
    trace_name: str, model: str, max_turns: int | None = None, api: str = "chat", progress: Progress | None = None
) -> str:
    """Start the simulator and the proxy, replay the trace direct and through the proxy; return the table."""
    from proxy.service.engine_service import build_context_service
    from proxy.shell import server  # imported late: `--help` and `--list` need neither the shell nor the engine

    trace = load_trace(trace_name)
    info = load_settings().model(model)
    sim_runner, sim_url = await start_simulator(SimulatorConfig(models={model: info.context_window}))
    sim = sim_runner.app[SIMULATOR]
    proxy_runner = None
    try:
        settings = load_settings(upstream_url=sim_url, anthropic_url=sim_url.removesuffix("/v1"))
        holder = ConfigHolder(settings, upstream_url=sim_url)
        proxy_runner, port = await server.start(holder, "127.0.0.1", 0, context=build_context_service(holder))
        direct = await replay(sim_url, trace, model, "direct", max_turns, api, progress)
        sim.reset()  # the proxied run starts with a cold prompt cache too
        session = f"http://127.0.0.1:{port}/s/demo-{int(time.time())}/v1"
        proxied = await replay(session, trace, model, "via proxy", max_turns, api, progress)
    finally:
        if proxy_runner is not None:
            await proxy_runner.cleanup()
        await sim_runner.cleanup()
    return render(trace, model, info, [direct, proxied])


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="context-proxy demo",
        description="Replay a real agent trace against a local 32k-window upstream, direct and through the "
        "proxy, and compare turns that fail and tokens billed. No API key, no network.",
    )
    parser.add_argument(
        "--trace", default=DEFAULT_TRACE, help=f"packaged trace or trace file (default {DEFAULT_TRACE})"
    )
    parser.add_argument(
        "--model",
        default=None,
        help=f"model from the packaged proxy.toml (default {DEFAULT_MODEL}; claude-sim-32k for --api messages)",
    )
    parser.add_argument("--turns", type=int, default=None, help="replay only the first N turns")
    parser.add_argument(
        "--api",
        choices=("chat", "responses", "messages"),
        default="chat",
        help="chat completions (default), the Responses API as Codex CLI sends it (reasoning items included), or "
        "Anthropic Messages as Claude Code sends it (signed thinking blocks, cache breakpoints; model claude-sim-32k)",
    )
    parser.add_argument("--list", action="store_true", help="list the packaged traces and exit")
    ns = parser.parse_args(args)
    if ns.list:
        print("\n".join(list_traces()))
        return 0
    try:
        load_trace(ns.trace)
    except ValueError as exc:
        parser.error(str(exc))
    started = time.monotonic()
    print(f"replaying {ns.trace} direct, then through the proxy ...", file=sys.stderr, flush=True)
    print(asyncio.run(run_demo(ns.trace, ns.model or DEFAULT_MODELS[ns.api], ns.turns, ns.api, print_progress)))
    print(f"\n(finished in {time.monotonic() - started:.1f} s)")
    return 0


async def _serve_simulator(host: str, port: int, delay_ms: int) -> None:
    runner, url = await start_simulator(SimulatorConfig(chunk_delay_s=delay_ms / 1000), host, port)
    models = ", ".join(SimulatorConfig().models)
    print(f"simulated upstream on {url} (chat completions, Responses, Anthropic Messages; models: {models})")
    anthropic = url.removesuffix("/v1")
    print(f"try: context-proxy serve --upstream {url} --anthropic-upstream {anthropic}   (Ctrl-C stops it)", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def simulate_main(args: list[str] | None = None) -> int:
    """`context-proxy simulate`: the demo's upstream on its own, to try the proxy with curl and no API key."""
    parser = argparse.ArgumentParser(
        prog="context-proxy simulate",
        description="Serve the local OpenAI-compatible simulator (streams, usage with cached tokens, "
        "window refusals) so the proxy can be tried with no API key and no network.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--delay-ms", type=int, default=50, help="pause between streamed chunks (default 50)")
    ns = parser.parse_args(args)
    # SIGTERM (`docker stop`; as PID 1 Python would ignore it) stops the simulator like Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_simulator(ns.host, ns.port, ns.delay_ms))
    return 0
