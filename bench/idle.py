"""Claude Code with pauses: what clearing at an expired cache saves (`cache_ttl_s`).

The packaged traces sent as Claude Code sends Messages (`bench anthropic`'s Claude-Code
breakpoints, a 200k model) to a simulator whose cache drops a prefix 5 minutes after its last
use, as Anthropic's does. Turns come `STEP_S` apart, and every `PAUSE_EVERY`-th after a pause of
`PAUSE_S` (a developer reading a diff, a long test run): the cache is cold then, direct and
through the proxy alike. Both the simulator's and the proxy's clocks are stepped, not slept.
Billed = input + 1.25 x written + 0.1 x read.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from bench import anthropic
from bench.stats import table
from proxy.demo.simulator import SimulatorConfig
from proxy.demo.traces import list_traces, load_trace

TTL_S, STEP_S, PAUSE_S = 300.0, 20.0, 420.0
PAUSES = (0, 20, 10)  # a pause before every N-th turn (0: none)


async def run_idle(traces: list[str] | None = None, pauses: tuple[int, ...] = PAUSES) -> dict[str, Any]:
    names = traces or list_traces()
    sim_runner, sim_url = await anthropic.start_simulator(SimulatorConfig(record_limit=4, cache_ttl_s=TTL_S))
    sim, base = sim_runner.app[anthropic.SIMULATOR], sim_url.removesuffix("/v1")
    now = [0.0]
    sim.clock = lambda: now[0]
    rows = []
    try:
        async with aiohttp.ClientSession() as client:
            for every in pauses:

                def step(k: int, every: int = every) -> None:
                    now[0] += PAUSE_S if every and k and k % every == 0 else STEP_S

                for name in names:
                    trace = load_trace(name)
                    sim.reset()
                    direct, _ = await anthropic.replay(
                        client, base, trace, anthropic.BIG_MODEL, "claude-code", sim, step
                    )
                    proxied, _ = await anthropic._proxied(
                        client, base, trace, anthropic.BIG_MODEL, "claude-code", sim, lambda: now[0], step
                    )
                    rows.append({"trace": name, "pause_every": every, "direct": direct.total, "proxy": proxied.total})
    finally:
        await sim_runner.cleanup()
    return {"rows": rows, "pauses": pauses, "ttl_s": TTL_S, "step_s": STEP_S, "pause_s": PAUSE_S}


def render(result: dict[str, Any]) -> str:
    header = ["trace", "pause every N turns", "direct billed", "proxy billed", "proxy/direct"]
    rows = [
        [r["trace"].split(".")[0], r["pause_every"] or "never", r["direct"], r["proxy"], r["proxy"] / r["direct"]]
        for r in result["rows"]
    ]
    totals = []
    for every in result["pauses"]:
        runs = [r for r in result["rows"] if r["pause_every"] == every]
        ratio = sum(r["proxy"] for r in runs) / sum(r["direct"] for r in runs)
        totals.append(f"pause every {every or 'never'}: {ratio:.3f}")
    head = (
        f"Claude Code, 200k, cache TTL {result['ttl_s']:.0f} s; turns {result['step_s']:.0f} s apart, "
        f"a pause of {result['pause_s']:.0f} s before every N-th"
    )
    return head + "\n" + table(header, rows) + "\nall traces: " + ", ".join(totals)
