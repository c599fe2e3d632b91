"""A cleared output can keep, in a stub, the lines the agent quoted after reading it (`proxy.context.stubs`)."""

from dataclasses import replace

from proxy.context import ClearPolicy, HeuristicCounter, ModelInfo, Policy
from proxy.context.clearing import CLEARED_SUFFIX, PLACEHOLDER, is_cleared
from proxy.context.journal import Journal
from proxy.context.pipeline import process
from proxy.context.stubs import choose_lines, decode, encode, render

COUNTER = HeuristicCounter()
CACHED = ModelInfo(context_window=9000, input_per_mtok=1.0, cached_input_per_mtok=0.1)
RULES = ClearPolicy(keep_tokens=1000, keep_under=100, clear_at_least=500, in_use_turns=0, stub_tokens=300)
POLICY = Policy(reserve_output_tokens=1000, clear_tool_outputs=RULES)
VIEW = "[File: /repo/src/io_utils.py (400 lines total)]\n" + "\n".join(
    f"{n}:    " + ("def read_header_v2(raw):" if n == 88 else f"value_{n} = compute_{n}(raw)") for n in range(40, 140)
)


QUOTE = "Line 88 of src/io_utils.py defines read_header_v2, after value_87 = compute_87(raw): I will edit it."


def run(steps: int, policy: Policy = POLICY) -> list[list[dict]]:
    """An agent that reads a numbered view of io_utils.py at step 2 and quotes its line 88 at step 3 only."""
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."}]
    journal, requests = Journal(), []
    for k in range(steps):
        text = QUOTE if k == 3 else f"Step {k}."
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": text, "tool_calls": [call]})
        body = VIEW if k == 2 else f"step {k} " + "x " * 800
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": body})
        outcome = process(journal, list(messages), tools=None, policy=policy, model=CACHED, counter=COUNTER)
        journal = Journal.from_dict(outcome.journal.to_dict())  # as a store keeps it between turns
        requests.append(outcome.messages)
    return requests


def output(request: list[dict], call_id: str) -> str:
    return next(m["content"] for m in request if m.get("tool_call_id") == call_id)


def test_a_cleared_view_keeps_its_header_and_the_quoted_line_with_its_neighbours():
    stub = output(run(24)[-1], "c2")
    lines = stub.split("\n")
    assert is_cleared(stub) and stub != PLACEHOLDER and stub.endswith(CLEARED_SUFFIX)
    assert lines[0] == "[File: /repo/src/io_utils.py (400 lines total)]"
    assert "88:    def read_header_v2(raw):" in lines and "89:    value_89 = compute_89(raw)" in lines
    assert "139:    value_139 = compute_139(raw)" not in lines


def test_the_stub_is_sent_byte_for_byte_on_every_turn_after_it_is_made():
    requests = run(24)
    stubs = [output(r, "c2") for r in requests[3:] if is_cleared(output(r, "c2"))]
    assert len(stubs) > 3 and len(set(stubs)) == 1 and stubs[0] != PLACEHOLDER


def test_an_output_the_agent_never_quoted_becomes_the_placeholder():
    assert output(run(24)[-1], "c1") == PLACEHOLDER


def test_with_stub_tokens_zero_a_clearing_the_window_forces_still_keeps_the_quoted_view():
    forced_only = replace(POLICY, clear_tool_outputs=replace(RULES, stub_tokens=0))  # forced_stub_tokens: 600
    assert output(run(24, forced_only)[-1], "c2") == output(run(24)[-1], "c2") != PLACEHOLDER


def test_with_both_stub_budgets_zero_the_quoted_view_becomes_the_placeholder():
    off = replace(POLICY, clear_tool_outputs=replace(RULES, stub_tokens=0, forced_stub_tokens=0))
    assert output(run(24, off)[-1], "c2") == PLACEHOLDER


def test_an_output_the_agent_quoted_too_little_of_becomes_the_placeholder():
    assert choose_lines(VIEW, frozenset({"read_header_v2", "88"}), 300, COUNTER) == ()


def test_a_stub_keeps_within_its_budget():
    quoted = frozenset({"read_header_v2", "88", "87", "value_87", "compute_87", "io_utils.py"})
    lines = choose_lines(VIEW, quoted, 40, COUNTER)
    assert 0 in lines and 1 + 88 - 40 in lines  # the header, and the line numbered 88
    assert sum(COUNTER.count_text(VIEW.split("\n")[i]) + 1 for i in lines) <= 40
    assert choose_lines(VIEW, frozenset({"nowhere_else"}), 300, COUNTER) == ()


def test_kept_lines_round_trip_through_the_journal_form():
    lines = (0, 12, 13, 14, 40)
    assert encode(lines) == "0,12-14,40" and decode(encode(lines)) == lines and decode("") == ()
    assert render("a\nb\nc", ()) == PLACEHOLDER
    assert render("a\nb\nc", (0, 2)) == f"a\nc\n[1 more lines of this output {CLEARED_SUFFIX}"
