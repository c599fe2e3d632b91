"""The most one clearing epoch could save, knowing when the run ends: an upper bound for any online rule.

For each turn t of a trace (the client's request as the agent sent it), the default policy's
whole clearing plan frees F tokens from token position p of an L-token request. Made at t, that
epoch costs (w - d)(L - F - p) - dF billed tokens at once (its tail re-written at the write price
w instead of read at d) and saves dF on each of the run's remaining turns. The best t, chosen
in hindsight, against the run's direct bill (each request read from the cache up to the last
one, its new tokens written at w), says whether a target such as "0.95 of direct with Anthropic's
1.25x writes and 0.1x reads" is within reach of clearing at all. In-use sparing is ignored, so
the plan frees at least as much as the proxy's would: the bound is generous.
"""

from __future__ import annotations

from typing import Any

from bench.stats import table
from proxy.context.clearing import ClearToolOutputs
from proxy.context.tokens import Counter
from proxy.traces import load_trace
from tests.context.replay import TRACE_NAMES, policy_for, turns

# (name, d, w): OpenAI's cached price at 0.5 and 0.1 of input; Anthropic's 0.1 reads and 1.25 writes.
PRICES = (("openai d=0.5", 0.5, 1.0), ("openai d=0.1", 0.1, 1.0), ("anthropic 5m", 0.1, 1.25))


def best_epoch(name: str, counter: Counter) -> dict[str, Any]:
    trace = load_trace(name)
    policy = policy_for(trace)
    clear = ClearToolOutputs.from_policy(policy.clear_tool_outputs)
    requests = list(turns(trace))
    sizes, plans = [], []
    for request in requests:
        counts = [counter.count_message(m) for m in request]
        plan = clear.plan(request, counter)
        indices = plan.indices(request)
        first = sum(counts[: min(indices)]) if indices else 0
        sizes.append(sum(counts))
        plans.append((plan.tokens, first))
    row: dict[str, Any] = {"trace": name.split(".")[0], "turns": len(requests)}
    for label, d, w in PRICES:
        direct = sum(d * before + w * (after - before) for before, after in zip([0, *sizes], sizes, strict=False))
        best, at = 0.0, -1
        for t, ((freed, first), size) in enumerate(zip(plans, sizes, strict=True)):
            if freed <= 0:
                continue
            cost = (w - d) * (size - freed - first) - d * freed
            net = d * freed * (len(requests) - t - 1) - cost
            if net > best:
                best, at = net, t
        row[label] = {"direct": direct, "best_net": best, "turn": at, "ratio": (direct - best) / direct}
    return row


def run_hindsight() -> dict[str, Any]:
    from proxy.tokens import counter_for

    counter = counter_for("o200k_base")
    rows = [best_epoch(name, counter) for name in TRACE_NAMES]
    totals = {}
    for label, _, _ in PRICES:
        direct = sum(r[label]["direct"] for r in rows)
        totals[label] = (direct - sum(r[label]["best_net"] for r in rows)) / direct
    return {"rows": rows, "totals": totals}


def render(result: dict[str, Any]) -> str:
    header = ["trace", "turns"] + [f"{label}: {col}" for label, _, _ in PRICES for col in ("best turn", "bill/direct")]
    rows = [
        [r["trace"], r["turns"], *(v for label, _, _ in PRICES for v in (r[label]["turn"], r[label]["ratio"]))]
        for r in result["rows"]
    ]
    lines = ["The best single clearing epoch in hindsight (default plan, no in-use sparing), bill vs direct:"]
    lines.append(table(header, rows))
    lines.append("all traces: " + ", ".join(f"{k}: {v:.3f}" for k, v in result["totals"].items()))
    return "\n".join(lines)
