"""A fleet of one agent served by one proxy: sessions one after another, each finished before the next (issue 27).

One proxy (the default config, gpt-4o's cached price at d × input) in front of the simulator. It first
serves the history sets (the packaged traces, then `bench/traces/sample_a`), each session counted finished
by the proxy's own sweep (`[policy] session_end_idle_s`, here 1 ms; the sweep is called after each run, as its
timer would), so these runs are billed as an agent with no history yet. Then it serves the measured set as
new sessions of the same agents: `tuned` (the history sets again, what the rule was tuned on) or `held-out`
(`sample_b`, never tuned on) or `held-out-c` (`sample_c`, drawn after every rule was chosen). Each run is also
replayed direct; billed input = uncached + d × cached.

`api="messages"`: the same sessions as Claude Code sends them (`bench anthropic`'s replay: breakpoints on the
system prompt and the last message, a signed thinking block per assistant turn) to claude-sonnet-4-5 (200k) at
the shipped prices, billed as Anthropic bills: input + 1.25 x cache writes + 0.1 x cache reads (d is unused).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import anthropic
from bench.quality import held_out, score
from bench.savings import Replay, _session_prefix, _settings, replay
from bench.stats import table
from proxy.config.loader import ConfigHolder, load_settings
from proxy.context import economics
from proxy.context.policy import policy_from_dict
from proxy.demo.simulator import SIMULATOR, Simulator, SimulatorConfig, start_simulator
from proxy.demo.traces import Trace, load_trace
from proxy.service.engine_service import build_context_service
from proxy.shell import server
from tests.context.replay import TRACE_NAMES

MODEL = "gpt-4o"  # 128k
END_IDLE_S = 0.001
RECORDED = 1000  # requests the simulator keeps: every turn of the longest run, for `bench quality`'s score


def _sets(measured: tuple[str, ...] = ()) -> dict[str, list[str | Path]]:
    """The history pass and the measured sets. Measuring the other agents' runs, the history pass serves
    `others_a` too (tuned): `others-tuned` serves it again, `others-held-out` serves `others_b`."""
    history: list[str | Path] = [*TRACE_NAMES, *held_out("sample_a")]
    others = any(name.startswith("others") for name in measured)
    return {
        "history": [*history, *held_out("others_a")] if others else history,
        "tuned": history,
        "held-out": list(held_out("sample_b")),
        "held-out-c": list(held_out("sample_c")),
        "others-tuned": list(held_out("others_a")),
        "others-held-out": list(held_out("others_b")),
    }


async def run_fleet(
    discount: float = 0.1,
    measured: tuple[str, ...] = ("tuned", "held-out"),
    api: str = "chat",
    behind: float | None = None,
) -> dict[str, Any]:
    """`behind` is `[policy] bet_overrun` for this run (the survival bet's cap, `economics.BEHIND` by default):
    the sweep that shows what the cap costs and what lifting it risks."""
    sets = _sets(measured)
    sim_runner, sim_url = await start_simulator(
        SimulatorConfig(models={MODEL: 128000, "claude-": 200000}, record_limit=RECORDED)
    )
    sim, sim_base = sim_runner.app[SIMULATOR], sim_url.removesuffix("/v1")
    if api == "messages":
        settings = replace(load_settings(upstream_url=sim_url, anthropic_url=sim_base), path="")
    else:
        settings = _settings(sim_url, discount)
    data = {**settings.policy_data, "session_end_idle_s": END_IDLE_S}
    if behind is not None:
        data["bet_overrun"] = behind
    holder = ConfigHolder(replace(settings, policy_data=data, policy=policy_from_dict(data)))
    context = build_context_service(holder)
    runner, port = await server.start(holder, context=context)
    result: dict[str, Any] = {
        "discount": discount,
        "api": api,
        "behind": holder.settings.policy.bet_overrun,
        "sets": {},
    }
    try:
        async with aiohttp.ClientSession() as client:
            for set_name in ("history", *measured):
                rows = []
                for name in sets[set_name]:
                    trace = load_trace(name)
                    session = f"http://127.0.0.1:{port}/s/{_session_prefix(trace)}{time.monotonic_ns()}"
                    sim.reset()
                    if api == "messages":
                        rows.append(await _messages_row(client, sim_base, session, trace, sim))
                    else:
                        direct = await replay(client, sim_url, trace, MODEL, None)
                        sim.reset()
                        proxied = await replay(client, session + "/v1", trace, MODEL, None)
                        sent = [orjson.loads(r.raw)["messages"] for r in sim.requests]
                        rows.append(_row(trace, direct, proxied, discount, sent))
                    time.sleep(2 * END_IDLE_S)
                    await context.ends.sweep()  # what the sweep's timer does once the run has been idle that long
                result["sets"][set_name] = rows
    finally:
        await runner.cleanup()
        context.close()
        await sim_runner.cleanup()
    return result


def _row(trace: Trace, direct: Replay, proxied: Replay, d: float, sent: list[list[dict]]) -> dict[str, Any]:
    """One run's bills, and what the requests that went upstream lost the agent (`bench quality`'s score)."""
    scored = score(trace, sent, 128000) if len(sent) == len(direct.turns) else None
    return {
        "trace": trace.name.split(".")[0],
        "turns": len(direct.turns),
        "epochs": sum(t.epoch for t in proxied.turns),
        "direct": direct.billed(d),
        "proxy": proxied.billed(d),
        "evidence": scored.evidence if scored else 0,
        "lost": scored.lost if scored else 0,
        "scored": scored.turns if scored else 0,
        "lost3": scored.lost3 if scored else 0,  # of them, turns whose next message lost 3 or more tokens
    }


async def _messages_row(
    client: aiohttp.ClientSession, sim_base: str, session: str, trace: Trace, sim: Simulator
) -> dict[str, Any]:
    model, style = anthropic.BIG_MODEL, "claude-code"
    direct, _ = await anthropic.replay(client, sim_base, trace, model, style, sim)
    sim.reset()
    proxied, _ = await anthropic.replay(client, session, trace, model, style, sim)
    return {
        "trace": trace.name.split(".")[0],
        "turns": trace.turns,
        "epochs": proxied.epochs,
        "direct": direct.total,
        "proxy": proxied.total,
    }


def render(result: dict[str, Any]) -> str:
    if result.get("api") == "messages":
        billed = "billed input (input + 1.25 x written + 0.1 x read), Claude Code's breakpoints, claude-sonnet-4-5"
        lines = [f"Messages: {billed}, one proxy, sessions in order"]
    else:
        lines = [f"d = {result['discount']}: billed input (uncached + d x cached), one proxy, sessions in order"]
    lines[0] += f"; survival bet capped at {result.get('behind', economics.BEHIND)} of direct behind"
    summary = []
    for set_name, rows in result["sets"].items():
        direct, proxy = sum(r["direct"] for r in rows), sum(r["proxy"] for r in rows)
        worst = max(rows, key=lambda r: r["proxy"] / max(1.0, r["direct"]))
        evidence, lost = sum(r.get("evidence", 0) for r in rows), sum(r.get("lost", 0) for r in rows)
        scored, lost3 = sum(r.get("scored", 0) for r in rows), sum(r.get("lost3", 0) for r in rows)
        summary.append(
            [
                set_name,
                len(rows),
                proxy / max(1.0, direct),
                worst["trace"],
                worst["proxy"] / max(1.0, worst["direct"]),
                f"{lost / evidence:.3f}" if evidence else "-",
                f"{lost3 / scored:.1%}" if scored else "-",
            ]
        )
    headers = ["set", "runs", "proxy/direct", "worst run", "its proxy/direct", "lost (128k)", "turns losing 3+"]
    lines.append(table(headers, summary))
    for set_name, rows in result["sets"].items():
        lines.append(f"\n{set_name}")
        body = [
            [r["trace"], r["turns"], r["epochs"], r["direct"], r["proxy"], r["proxy"] / max(1.0, r["direct"])]
            for r in rows
        ]
        lines.append(table(["trace", "turns", "epochs", "direct", "proxy", "proxy/direct"], body))
    return "\n".join(lines)
