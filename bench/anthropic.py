"""The Messages API's figures (issue 14): the packaged traces as Claude Code would send them, direct and proxied.

In-process simulator and proxy, as `bench savings`. The traces are converted to Messages
(`proxy.demo.traces_messages`: tool calls as tool_use/tool_result, a signed thinking block on every
assistant turn). Billed input, in full-price token equivalents, is Anthropic's:
input + 1.25 x cache writes + 0.1 x cache reads. Three runs per trace:
- a 32k model through the proxy, Claude-Code breakpoints: every turn answered? and per turn, what
  reached the upstream against what the client sent (last message intact, task kept, the share of
  the last six messages unchanged, every thinking block byte-identical to one the client sent);
- a 200k model with Claude-Code breakpoints (system + last message), direct and proxied;
- the same model with a client that marks no breakpoints, direct and proxied.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.stats import table
from proxy.config.loader import ConfigHolder, load_settings
from proxy.demo.simulator import SIMULATOR, Simulator, SimulatorConfig, start_simulator
from proxy.demo.traces import Trace, list_traces, load_trace
from proxy.demo.traces_messages import messages_requests
from proxy.service.engine_service import build_context_service
from proxy.shell import server

WINDOW_MODEL, BIG_MODEL = "claude-sim-32k", "claude-sonnet-4-5"
WRITE, READ = 1.25, 0.1


def unmarked(value: Any) -> Any:
    """A message or block without `cache_control` (the proxy may move breakpoints; content is what counts)."""
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    return value


@dataclass
class Kept:
    """What reached the upstream, compared with what the client sent, over a replay's answered turns."""

    turns: int = 0
    last_intact: int = 0
    task_kept: int = 0
    last_six: int = 0
    last_six_same: int = 0
    thinking: int = 0
    thinking_altered: int = 0

    def check(self, sent: dict[str, Any], upstream: dict[str, Any]) -> None:
        messages, forwarded = unmarked(sent["messages"]), unmarked(upstream["messages"])
        self.turns += 1
        self.last_intact += forwarded[-1] == messages[-1]
        self.task_kept += messages[0] in forwarded
        self.last_six += min(6, len(messages))
        self.last_six_same += sum(m in forwarded for m in messages[-6:])
        issued = {orjson.dumps(b) for m in sent["messages"] for b in m["content"] if b.get("type") == "thinking"}
        for message in upstream["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block.get("type") == "thinking":
                    self.thinking += 1
                    self.thinking_altered += orjson.dumps(block) not in issued

    def to_dict(self) -> dict[str, Any]:
        return {
            "turns": self.turns, "last_message_intact": self.last_intact, "task_kept": self.task_kept,
            "last_six_unchanged_share": self.last_six_same / max(1, self.last_six),
            "thinking_blocks_forwarded": self.thinking, "thinking_blocks_altered": self.thinking_altered,
        }  # fmt: skip


@dataclass
class Run:
    answered: int = 0
    refused: int = 0
    billed: list[float] = field(default_factory=list)  # per answered turn
    tokens: int = 0  # input + written + read
    epochs: int = 0  # turns the proxy said edited the cached prefix (X-Context-Epoch)

    @property
    def total(self) -> float:
        return sum(self.billed)


async def replay(
    client: aiohttp.ClientSession,
    base: str,
    trace: Trace,
    model: str,
    style: str,
    sim: Simulator,
    before_turn: Callable[[int], None] | None = None,
) -> tuple[Run, Kept]:
    """Every turn of `trace` sent to `base`; `before_turn(k)` runs before turn k is sent (a clock to step)."""
    run, kept = Run(), Kept()
    headers = {"x-api-key": "sk-ant-bench", "anthropic-version": "2023-06-01", "Content-Type": "application/json"}
    for k, body in enumerate(messages_requests(trace, model, style)):
        if before_turn is not None:
            before_turn(k)
        async with client.post(base + "/v1/messages", data=orjson.dumps(body), headers=headers) as response:
            raw = await response.read()
        if response.status != 200:
            run.refused += 1
            continue
        usage = orjson.loads(raw)["usage"]
        read, written = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
        run.answered += 1
        run.epochs += response.headers.get("X-Context-Epoch") == "1"
        run.billed.append(usage["input_tokens"] + WRITE * written + READ * read)
        run.tokens += usage["input_tokens"] + written + read
        kept.check(body, sim.requests[-1].body)
    return run, kept


async def _proxied(
    client: aiohttp.ClientSession,
    sim_base: str,
    trace: Trace,
    model: str,
    style: str,
    sim: Simulator,
    clock: Callable[[], float] | None = None,
    before_turn: Callable[[int], None] | None = None,
) -> tuple[Run, Kept]:
    """The same replay through a proxy of its own; `clock`, if given, is its session store's."""
    holder = ConfigHolder(load_settings(upstream_url=sim_base + "/v1", anthropic_url=sim_base))
    context = build_context_service(holder)
    if clock is not None:
        context.store.clock = clock
    runner, port = await server.start(holder, context=context)
    try:
        sim.reset()
        base = f"http://127.0.0.1:{port}/s/bench-{time.monotonic_ns()}"
        return await replay(client, base, trace, model, style, sim, before_turn)
    finally:
        await runner.cleanup()


async def run_anthropic(traces: list[str] | None = None) -> dict[str, Any]:
    traces = traces or list_traces()
    sim_runner, sim_url = await start_simulator(SimulatorConfig(record_limit=4))
    sim, sim_base = sim_runner.app[SIMULATOR], sim_url.removesuffix("/v1")
    rows: list[dict[str, Any]] = []
    try:
        async with aiohttp.ClientSession() as client:
            for name in traces:
                trace = load_trace(name)
                small, kept = await _proxied(client, sim_base, trace, WINDOW_MODEL, "claude-code", sim)
                row: dict[str, Any] = {"trace": name, "turns": trace.turns, "32k": {"answered": small.answered,
                                       "refused": small.refused, **kept.to_dict()}}  # fmt: skip
                for style in ("claude-code", "none"):
                    sim.reset()
                    direct, _ = await replay(client, sim_base, trace, BIG_MODEL, style, sim)
                    proxied, _ = await _proxied(client, sim_base, trace, BIG_MODEL, style, sim)
                    row[style] = {
                        "direct_billed": direct.total, "proxy_billed": proxied.total, "tokens_direct": direct.tokens,
                        "ratio": proxied.total / max(1.0, direct.total), "direct_full_price": direct.tokens,
                        "turns_above_direct": sum(p > d for p, d in zip(proxied.billed, direct.billed, strict=False)),
                        "answered": [direct.answered, proxied.answered],
                    }  # fmt: skip
                rows.append(row)
    finally:
        await sim_runner.cleanup()
    return {"rows": rows, "totals": _totals(rows)}


def _totals(rows: list[dict[str, Any]]) -> dict[str, float]:
    out = {}
    for style in ("claude-code", "none"):
        out[f"{style}: proxy/direct"] = sum(r[style]["proxy_billed"] for r in rows) / max(
            1.0, sum(r[style]["direct_billed"] for r in rows)
        )
    out["none: proxy/direct full price"] = sum(r["none"]["proxy_billed"] for r in rows) / max(
        1.0, sum(r["none"]["direct_full_price"] for r in rows)
    )
    return out


def render(result: dict[str, Any]) -> str:
    header = ["trace", "turns", "32k ok", "32k refused", "last intact", "task kept", "last six same", "thinking fwd",
              "altered", "cc direct", "cc proxy", "cc ratio", "cc turns > direct", "none direct", "none proxy",
              "none ratio"]  # fmt: skip
    rows = []
    for r in result["rows"]:
        k, cc, none = r["32k"], r["claude-code"], r["none"]
        rows.append(
            [r["trace"].split(".")[0], r["turns"], k["answered"], k["refused"], k["last_message_intact"],
             k["task_kept"], k["last_six_unchanged_share"], k["thinking_blocks_forwarded"],
             k["thinking_blocks_altered"], cc["direct_billed"], cc["proxy_billed"], cc["ratio"],
             cc["turns_above_direct"], none["direct_billed"], none["proxy_billed"], none["ratio"]]
        )  # fmt: skip
    lines = [
        "Anthropic Messages: billed = input + 1.25 x cache writes + 0.1 x cache reads (full-price token equivalents)",
        f"32k: {WINDOW_MODEL} through the proxy; cc = Claude-Code breakpoints, none = no breakpoints, on {BIG_MODEL}",
        table(header, rows),
        "\nall traces:",
    ]
    lines += [f"  {name}: {value:.3f}" for name, value in result["totals"].items()]
    return "\n".join(lines)
