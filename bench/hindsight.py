"""The most one clearing epoch could save, knowing when the run ends: an upper bound for any online rule.

For each turn t of a trace (the client's request as the agent sent it), the default policy's
whole clearing plan frees F tokens from token position p of an L-token request. Made at t, that
epoch costs (w - d)(L - F - p) - dF billed tokens at once (its tail re-written at the write price
w instead of read at d) and saves dF on each of the run's remaining turns. The best t, chosen
in hindsight, against the run's direct bill (each request read from the cache up to the last
one, its new tokens written at w), says whether a target such as "0.95 of direct with Anthropic's
1.25x writes and 0.1x reads" is within reach of clearing at all. In-use sparing is ignored, so
the plan frees at least as much as the proxy's would: the bound is generous.

`best_schedule` lifts the one-epoch limit: any number of epochs, each at a turn chosen in
hindsight and clearing what the default plan would clear then (on top of what earlier epochs
cleared), found by dynamic programming over the turn of the last epoch. Requests are billed block
by block (a message is a block): the prefix shared with the request before at d, the rest at w.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.stats import table
from proxy.context.clearing import PLACEHOLDER, ClearToolOutputs
from proxy.context.tokens import Counter
from proxy.demo.traces import load_trace
from tests.context.replay import TRACE_NAMES, policy_for, turns

# (name, d, w): OpenAI's cached price at 0.5 and 0.1 of input; Anthropic's 0.1 reads and 1.25 writes.
PRICES = (("openai d=0.5", 0.5, 1.0), ("openai d=0.1", 0.1, 1.0), ("anthropic 5m", 0.1, 1.25))


def best_epoch(name: str | Path, counter: Counter) -> dict[str, Any]:
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
    row: dict[str, Any] = {"trace": trace.name.split(".")[0], "turns": len(requests)}
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


State = frozenset[int]


def cheapest_epochs(
    plans: list[State], plain: Callable[[State, int], float], epoch: Callable[[State, State, int], float]
) -> tuple[float, list[int]]:
    """The least bill of a run's turns and the turns of its epochs, in hindsight: an epoch at turn t clears
    `plans[t]` on top of what earlier ones cleared; `plain(state, u)` bills turn u appended under `state`,
    `epoch(old, new, t)` bills turn t as the first under `new`. Dynamic programming over the last epoch's turn."""
    n = len(plans)
    best: dict[int, tuple[float, list[int]]] = {}
    for s in range(n - 1, -2, -1):
        state = plans[s] if s >= 0 else frozenset()
        run, choice = 0.0, (sum(plain(state, u) for u in range(s + 1, n)), [])
        for t in range(s + 1, n):
            grown = state | plans[t]
            if grown != state and t in best:
                total = run + epoch(state, grown, t) + best[t][0]
                if total < choice[0]:
                    choice = (total, [t, *best[t][1]])
            run += plain(state, t)
        best[s] = choice
    return best[-1]


def best_schedule(name: str | Path, counter: Counter, d: float, w: float) -> dict[str, Any]:
    """The cheapest schedule of clearing epochs in hindsight, and the direct bill, for one trace."""
    trace = load_trace(name)
    clear = ClearToolOutputs.from_policy(policy_for(trace).clear_tool_outputs)
    requests = list(turns(trace))
    n, messages = len(requests), requests[-1]
    full = [counter.count_message(m) for m in messages]
    cleared = [counter.count_message({**m, "content": PLACEHOLDER}) for m in messages]
    sizes = [len(r) for r in requests]
    plans = [frozenset(clear.plan(r, counter).indices(r)) for r in requests]

    def tokens(state: frozenset[int], upto: int) -> int:
        return sum(cleared[i] if i in state else full[i] for i in range(upto))

    def plain(state: frozenset[int], u: int) -> float:
        """Turn u appends to turn u - 1 under the same clearing: its old part read, its new part written."""
        before = tokens(state, sizes[u - 1]) if u else 0
        return d * before + w * (tokens(state, sizes[u]) - before)

    def epoch(old: frozenset[int], new: frozenset[int], t: int) -> float:
        """Turn t under `new` after turn t - 1 under `old`: read up to the first message that changed."""
        first = min(new - old, default=sizes[t - 1] if t else 0)
        shared = tokens(old, min(first, sizes[t - 1] if t else 0))
        return d * shared + w * (tokens(new, sizes[t]) - shared)

    direct = sum(plain(frozenset(), u) for u in range(n))
    # best[s]: the least bill of turns s+1.. given an epoch at turn s, after which plans[s] is cleared
    # (a later plan holds an earlier one: the keep boundary only moves forward; `growing` counts the exceptions).
    growing = sum(not a <= b for a, b in itertools.pairwise(plans) if a and b)
    bill, epochs = cheapest_epochs(plans, plain, epoch)
    return {"trace": trace.name.split(".")[0], "direct": direct, "bill": bill, "epochs": epochs, "not_nested": growing}


def run_hindsight(sets: dict[str, list[str | Path]] | None = None) -> dict[str, Any]:
    """Both bounds on each set of traces (`bench quality`'s set names; the packaged traces by default)."""
    from proxy.tokens.counter import counter_for

    counter = counter_for("o200k_base")
    result: dict[str, Any] = {}
    for set_name, names in (sets or {"packaged": list(TRACE_NAMES)}).items():
        rows = [best_epoch(name, counter) for name in names]
        totals, schedules = {}, {}
        for label, d, w in PRICES:
            direct = sum(r[label]["direct"] for r in rows)
            totals[label] = (direct - sum(r[label]["best_net"] for r in rows)) / direct
            schedules[label] = [best_schedule(name, counter, d, w) for name in names]
        result[set_name] = {"rows": rows, "totals": totals, "schedules": schedules}
    return result


def render(result: dict[str, Any]) -> str:
    return "\n\n".join(f"== {set_name}\n{_render_set(one)}" for set_name, one in result.items())


def _render_set(result: dict[str, Any]) -> str:
    header = ["trace", "turns"] + [f"{label}: {col}" for label, _, _ in PRICES for col in ("best turn", "bill/direct")]
    rows = [
        [r["trace"], r["turns"], *(v for label, _, _ in PRICES for v in (r[label]["turn"], r[label]["ratio"]))]
        for r in result["rows"]
    ]
    lines = ["The best single clearing epoch in hindsight (default plan, no in-use sparing), bill vs direct:"]
    lines.append(table(header, rows))
    lines.append("all traces: " + ", ".join(f"{k}: {v:.3f}" for k, v in result["totals"].items()))
    lines.append("\nThe best schedule of any number of epochs in hindsight (default plan each time), bill vs direct:")
    header = ["trace", *(f"{label}: {col}" for label in result["schedules"] for col in ("epochs", "bill/direct"))]
    names = [s["trace"] for s in next(iter(result["schedules"].values()))]
    rows = [
        [
            name,
            *(
                v
                for runs in result["schedules"].values()
                for v in (len(runs[k]["epochs"]), runs[k]["bill"] / runs[k]["direct"])
            ),
        ]
        for k, name in enumerate(names)
    ]
    lines.append(table(header, rows))
    totals = {
        label: sum(r["bill"] for r in runs) / sum(r["direct"] for r in runs)
        for label, runs in result["schedules"].items()
    }
    lines.append("all traces: " + ", ".join(f"{k}: {v:.3f}" for k, v in totals.items()))
    return "\n".join(lines)
