"""The epoch rule's guesses, measured: turns still to come, what a first edit may risk, what a bet may stake.

`economics.TURNS_TO_COME` (turns expected to come, as a share of those passed), the budget
(`economics.within_budget`: what an edit may cost beyond what it frees at once: `STAKE`, the share
of the banked savings one edit may spend, plus its own saving on the `REPAY_TURNS` turns after it,
plus, on a session's first edit only, `Policy.first_edit_risk_turns` turns' input) are replayed over
the packaged, the held-out and the two sampled sets of traces in-process, at 128k and d = 0.5 and
0.1 (at d = 1 every edit pays at once and no guess matters), and over the packaged traces as Claude
Code sends them (`bench idle`'s 200k run with its breakpoints, 1.25x writes and 0.1x reads: without
pauses, and with a 7-minute pause every 20 turns). Each row: billed input vs direct over the set,
the worst single trace (above 1: the proxy cost that session more than no proxy), and the lost rate
of `bench quality` (OpenAI rows).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import proxy.context.draft as draft_module
import proxy.context.economics as economics
from bench import idle
from bench.quality import Score, Setting, held_out, measure
from bench.stats import table
from proxy.demo.traces import load_trace
from tests.context.replay import TRACE_NAMES

# (turns to come per turn passed, turns' input the first edit may risk, the share of the banked savings one
# bet may stake, turns after it whose saving an edit may spend); the first is the shipped rule
RULES = (
    (0.5, 0.0, 0.5, 1.0),
    (0.25, 0.0, 0.5, 1.0),
    (1.0, 0.0, 0.5, 1.0),
    (2.0, 0.0, 0.5, 1.0),
    (1.0, 0.0, 1.0, 1.0),
    (1.0, 0.0, 0.25, 1.0),
    (1.0, 0.0, 0.5, 2.0),
    (1.0, 0.0, 0.5, 4.0),
    (1.0, 1.0, 0.5, 1.0),
    (2.0, 3.0, 0.5, 1.0),
)
DISCOUNTS = (0.5, 0.1)


@contextmanager
def rule(turns_to_come: float, first_edit_risk: float, stake: float, repay_turns: float) -> Iterator[None]:
    """The engine with these guesses in place of its own, for one replay."""
    saved = economics.TURNS_TO_COME, economics.STAKE, economics.REPAY_TURNS, draft_module.within_budget

    def budget(cost: float, banked: float, per_turn: float, first_turn: float, _risk: float, *rest: float) -> bool:
        return saved[3](cost, banked, per_turn, first_turn, first_edit_risk, *rest)

    economics.TURNS_TO_COME, economics.STAKE, economics.REPAY_TURNS = turns_to_come, stake, repay_turns
    draft_module.within_budget = budget  # what `Draft.edit_value` calls, for clearings and early truncations alike
    try:
        yield
    finally:
        economics.TURNS_TO_COME, economics.STAKE, economics.REPAY_TURNS, draft_module.within_budget = saved


def run_epoch_rule() -> dict[str, Any]:
    from proxy.tokens.counter import counter_for

    counter = counter_for("o200k_base")
    sets = {
        "packaged": [load_trace(n) for n in TRACE_NAMES],
        "held-out": [load_trace(p) for p in held_out()],
        "samples A+B": [load_trace(p) for p in held_out("sample_a") + held_out("sample_b")],
    }
    rows = []
    for turns_to_come, first_edit_risk, stake, repay_turns in RULES:
        at = {"turns_to_come": turns_to_come, "risk": first_edit_risk, "stake": stake, "repay": repay_turns}
        with rule(turns_to_come, first_edit_risk, stake, repay_turns):
            runs = asyncio.run(idle.run_idle(list(TRACE_NAMES), pauses=(0, 20)))["rows"]
            for label, every in (("packaged, Claude Code", 0), ("same, a 7-min pause every 20 turns", 20)):
                bills = [(r["direct"], r["proxy"]) for r in runs if r["pause_every"] == every]
                direct = sum(d for d, _ in bills)
                worst = max(p / d for d, p in bills)
                rows.append({**at, "set": label, "d": 0.1, "ratio": sum(p for _, p in bills) / direct,
                             "worst": worst, "lost_rate": float("nan")})  # fmt: skip
            for set_name, traces in sets.items():
                for d in DISCOUNTS:
                    score, billed, direct, worst = Score(), 0.0, 0.0, 0.0
                    for trace in traces:
                        m = measure(Setting("default"), trace, 128000, d, counter)
                        score.add(m["score"])
                        billed, direct = billed + m["billed"], direct + m["direct"]
                        worst = max(worst, m["billed"] / m["direct"])
                    rows.append(
                        {
                            **at,
                            "set": set_name,
                            "d": d,
                            "ratio": billed / direct,
                            "worst": worst,
                            "lost_rate": score.rate,
                        }
                    )
    return {"rows": rows}


def render(result: dict[str, Any]) -> str:
    header = ["turns to come", "first edit risks", "stake", "repay turns", "set", "d", "billed/direct", "worst trace",
              "lost rate"]  # fmt: skip
    rows = []
    for r in result["rows"]:
        figures = map(_cell, (r["ratio"], r["worst"], r["lost_rate"]))
        rows.append([r["turns_to_come"], r["risk"], r["stake"], r["repay"], r["set"], r["d"], *figures])
    title = "The epoch rule (128k, Claude Code 200k; default policy otherwise; the first block is the shipped rule):"
    return title + "\n" + table(header, rows)


def _cell(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"
