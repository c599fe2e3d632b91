"""The Responses API's figures (issue 13): the packaged traces as Codex would send them, direct and through the proxy.

The same replay as `bench savings` (in-process simulator and proxy, billed input = uncached +
d × cached), with the traces converted to Responses items (`proxy.demo.traces_responses`: tool calls
as function_call/function_call_output, a signed reasoning item before each assistant turn's
output). Per proxied turn it also checks what reached the upstream against what the client sent:
the last item intact, the task (first user item) kept, the share of the last six items unchanged,
and every reasoning item byte-identical to one the client sent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.savings import DISCOUNTS, MODELS, Replay, Turn, _row, _session_prefix, _settings
from bench.stats import table
from proxy.config.loader import ConfigHolder
from proxy.demo.simulator import SIMULATOR, Simulator, SimulatorConfig, start_simulator
from proxy.demo.traces import Trace, list_traces, load_trace
from proxy.demo.traces_responses import responses_requests
from proxy.service.engine_service import build_context_service
from proxy.shell import server


@dataclass
class Kept:
    """What reached the upstream, compared with what the client sent, over a replay's answered turns."""

    turns: int = 0
    last_intact: int = 0
    task_kept: int = 0
    last_six: int = 0
    last_six_same: int = 0
    reasoning: int = 0
    reasoning_altered: int = 0
    problems: list[str] = field(default_factory=list)

    def check(self, k: int, sent: dict[str, Any], upstream: dict[str, Any]) -> None:
        items, forwarded = sent["input"], upstream["input"]
        self.turns += 1
        self.last_intact += forwarded[-1] == items[-1]
        task = next(item for item in items if item.get("role") == "user")
        self.task_kept += task in forwarded
        self.last_six += min(6, len(items))
        self.last_six_same += sum(item in forwarded for item in items[-6:])
        issued = {item["id"]: item for item in items if item.get("type") == "reasoning"}
        for item in forwarded:
            if item.get("type") == "reasoning":
                self.reasoning += 1
                if issued.get(item.get("id")) != item:
                    self.reasoning_altered += 1
                    self.problems.append(f"turn {k}: reasoning item {item.get('id')} altered")

    def to_dict(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "last_item_intact": self.last_intact,
            "task_kept": self.task_kept,
            "last_six_unchanged_share": self.last_six_same / max(1, self.last_six),
            "reasoning_items_forwarded": self.reasoning,
            "reasoning_items_altered": self.reasoning_altered,
        }


async def replay(
    client: aiohttp.ClientSession, base: str, trace: Trace, model: str, limit: int | None, sim: Simulator
) -> tuple[Replay, Kept]:
    out, kept = Replay(), Kept()
    headers = {"Authorization": "Bearer sk-bench-responses", "Content-Type": "application/json"}
    for k, body in enumerate(responses_requests(trace, model)):
        if limit is not None and k >= limit:
            break
        async with client.post(base + "/responses", data=orjson.dumps(body), headers=headers) as response:
            raw = await response.read()
            turn = Turn(response.status, epoch=response.headers.get("X-Context-Epoch") == "1")
        if turn.status == 200:
            usage = orjson.loads(raw)["usage"]
            turn.prompt = usage["input_tokens"]
            turn.cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
            kept.check(k, body, sim.requests[-1].body)
        out.turns.append(turn)
    return out, kept


async def run_responses(traces: list[str] | None = None, limit: int | None = None) -> dict[str, Any]:
    traces = traces or list_traces()
    sim_runner, sim_url = await start_simulator(SimulatorConfig(models=dict(MODELS), record_limit=4))
    sim = sim_runner.app[SIMULATOR]
    rows: list[dict[str, Any]] = []
    try:
        async with aiohttp.ClientSession() as client:
            for name in traces:
                trace = load_trace(name)
                for model in MODELS:
                    sim.reset()
                    direct, _ = await replay(client, sim_url, trace, model, limit, sim)
                    proxied: dict[float, Replay] = {}
                    kept: dict[float, Kept] = {}
                    for d in DISCOUNTS:
                        holder = ConfigHolder(_settings(sim_url, d))
                        runner, port = await server.start(holder, context=build_context_service(holder))
                        try:
                            sim.reset()
                            session = f"http://127.0.0.1:{port}/s/{_session_prefix(trace)}{time.monotonic_ns()}/v1"
                            proxied[d], kept[d] = await replay(client, session, trace, model, limit, sim)
                        finally:
                            await runner.cleanup()
                    row = _row(trace, model, direct, proxied)
                    for d, k in kept.items():
                        both = {
                            i
                            for i, (a, b) in enumerate(zip(direct.turns, proxied[d].turns, strict=True))
                            if a.status == b.status == 200
                        }
                        row["proxy"][str(d)].update(
                            kept=k.to_dict(), problems=k.problems[:5],
                            billed_common=proxied[d].billed(d, both), direct_billed_common=direct.billed(d, both),
                        )  # fmt: skip
                    rows.append(row)
    finally:
        await sim_runner.cleanup()
    return {"rows": rows, "totals": _totals(rows)}


def _totals(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Billed proxy ÷ direct over every trace, per model and d, on the turns both answered."""
    out: dict[str, dict[str, float]] = {}
    for model in MODELS:
        for d in map(str, DISCOUNTS):
            mine = [r["proxy"][d] for r in rows if r["model"] == model]
            direct = sum(p["direct_billed_common"] for p in mine)
            out.setdefault(model, {})[d] = sum(p["billed_common"] for p in mine) / max(1.0, direct)
    return out


def render(result: dict[str, Any]) -> str:
    header = ["trace", "model", "d", "turns", "ok direct", "ok proxy", "billed direct", "billed proxy",
              "proxy/direct", "(turns both ok)", "last intact", "task kept", "last six same", "reasoning fwd",
              "altered"]  # fmt: skip
    rows = []
    for r in result["rows"]:
        for d, p in r["proxy"].items():
            k = p["kept"]
            rows.append(
                [r["trace"].split(".")[0], r["model"], d, r["turns"], r["direct"]["answered"], p["answered"],
                 p["direct_billed"], p["billed"], p["billed"] / max(1.0, p["direct_billed"]),
                 p["billed_ratio_common_turns"], k["last_item_intact"],
                 k["task_kept"], k["last_six_unchanged_share"], k["reasoning_items_forwarded"],
                 k["reasoning_items_altered"]]
            )  # fmt: skip
    lines = ["Responses API: billed = uncached + d x cached input tokens; refused turns bill 0", table(header, rows)]
    lines.append("\nall traces, billed proxy/direct on the turns both answered:")
    for model, by_d in result["totals"].items():
        lines.append(f"  {model}: " + ", ".join(f"d={d}: {ratio:.3f}" for d, ratio in by_d.items()))
    return "\n".join(lines)
