"""The clairvoyant clearing of `bench frontier`: replayed through the engine and scored by `bench.quality`."""

from __future__ import annotations

from bench.frontier import BUDGET, oracle_row, setting_row
from bench.quality import Setting
from proxy.tokens.counter import counter_for
from tests.context.replay import TRACE_NAMES, load

COUNTER = counter_for("o200k_base")
TRACES = [load(name) for name in TRACE_NAMES]


def test_the_oracle_that_keeps_every_needed_output_loses_nothing_and_bills_under_the_default():
    oracle = oracle_row("packaged", TRACES, COUNTER, 0.0)
    # the oracle bounds clearing: against the default with the agent's own messages whole, as the oracle sends them
    whole = Setting("agent messages whole", policy={"agent_message_tokens": 0})
    default = setting_row("packaged", whole, TRACES, COUNTER)
    for d in ("1.0", "0.5"):
        assert oracle[d]["evidence"] == default[d]["evidence"] > 1000
        assert oracle[d]["lost_rate"] == 0.0
        assert oracle[d]["billed_ratio"] < default[d]["billed_ratio"]
    assert oracle["0.5"]["epochs"] < oracle["1.0"]["epochs"]  # at d < 1 an epoch re-bills its tail: fewer pay


def test_the_oracle_within_the_budget_spends_it_and_no_more():
    free = oracle_row("packaged", TRACES, COUNTER, 0.0)
    spent = oracle_row("packaged", TRACES, COUNTER, BUDGET)
    assert 0.03 < spent["1.0"]["lost_rate"] <= BUDGET
    assert spent["1.0"]["billed_ratio"] < free["1.0"]["billed_ratio"]
