"""Clearing spares the outputs the agent is still quoting, and never an epoch for them."""

from dataclasses import replace

from proxy.context import ClearPolicy, HeuristicCounter, ModelInfo, Policy
from proxy.context.clearing import PLACEHOLDER
from proxy.context.journal import Journal
from proxy.context.pipeline import process

COUNTER = HeuristicCounter()
# Cached at a tenth of the price: clearing waits for the window, then clears a batch of outputs at once.
CACHED = ModelInfo(context_window=9000, input_per_mtok=1.0, cached_input_per_mtok=0.1)
POLICY = Policy(
    reserve_output_tokens=1000, clear_tool_outputs=ClearPolicy(keep_tokens=1000, keep_under=100, clear_at_least=500)
)


def run(steps: int, quoted_step: int, quote_from: int, policy: Policy = POLICY, quote_until: int = 99) -> list[dict]:
    """An agent whose step `quoted_step` output names `read_header_v2`, which it quotes from step `quote_from` on."""
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."}]
    journal, sent = Journal(), []
    for k in range(steps):
        text = "Looking at read_header_v2 again." if quote_from <= k <= quote_until else f"Step {k}."
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": text, "tool_calls": [call]})
        body = f"step {k} " + ("src/io_utils.py:88 def read_header_v2(raw): " if k == quoted_step else "") + "x " * 800
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": body})
        outcome = process(journal, list(messages), tools=None, policy=policy, model=CACHED, counter=COUNTER)
        journal, sent = outcome.journal, outcome.messages
    return sent


def contents(sent: list[dict]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in sent if m.get("role") == "tool"}


def test_an_output_the_agent_keeps_quoting_stays_while_its_neighbours_are_cleared():
    out = contents(run(steps=24, quoted_step=2, quote_from=4))
    assert out["c1"] == out["c3"] == PLACEHOLDER
    assert "read_header_v2" in out["c2"]


def test_without_in_use_the_same_output_is_cleared():
    off = replace(POLICY, clear_tool_outputs=replace(POLICY.clear_tool_outputs, in_use_turns=0))
    assert contents(run(steps=24, quoted_step=2, quote_from=4, policy=off))["c2"] == PLACEHOLDER


def test_an_output_quoted_only_before_the_last_six_messages_is_cleared():
    sent = run(steps=24, quoted_step=2, quote_from=3, quote_until=4)
    assert contents(sent)["c2"] == PLACEHOLDER


def test_sparing_a_quoted_output_never_stops_an_epoch_that_pays():
    """With cheap caching a clearing must free enough to repay its rewrite: when the quoted output is most
    of what there is to clear, the rest alone would never pay, so the quoted one is cleared with it."""
    model = ModelInfo(context_window=128000, input_per_mtok=1.0, cached_input_per_mtok=0.1)
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."}]
    journal, sent = Journal(), []
    for k in range(40):
        text = "Looking at read_header_v2 again." if k > 2 else f"Step {k}."
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": text, "tool_calls": [call]})
        quoted = "src/io_utils.py:88 def read_header_v2(raw): " + "x " * 12000
        body = quoted if k == 2 else "x " * (1200 if k < 2 else 400)
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"step {k} {body}"})
        outcome = process(journal, list(messages), tools=None, policy=POLICY, model=model, counter=COUNTER)
        journal, sent = outcome.journal, outcome.messages
    out = contents(sent)
    assert out["c0"] == out["c1"] == out["c2"] == PLACEHOLDER
