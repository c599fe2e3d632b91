"""Live recall misses and re-runs: the agent's newest message against what the proxy removed."""

import json

from proxy.context import ClearPolicy, HeuristicCounter, ModelInfo, Policy
from proxy.context.clearing import PLACEHOLDER
from proxy.context.journal import Journal
from proxy.context.pipeline import process

COUNTER = HeuristicCounter()
NO_CACHE = ModelInfo(context_window=128000, input_per_mtok=1.0, cached_input_per_mtok=1.0)
POLICY = Policy(clear_tool_outputs=ClearPolicy(keep_tokens=0, keep_under=10, clear_at_least=100, in_use_turns=0))


def call(k: int, command: str, text: str = "") -> dict:
    arguments = json.dumps({"command": command})
    return {"role": "assistant", "content": text, "tool_calls": [{"id": f"c{k}", "function": {"arguments": arguments}}]}


def output(k: int, text: str) -> dict:
    return {"role": "tool", "tool_call_id": f"c{k}", "content": text + " " + "x " * 300}


def turns(messages: list[dict]) -> tuple[list, Journal]:
    """Send each prefix that ends in a tool output, as an agent would; the reports and the last journal."""
    journal, reports, sent = Journal(), [], []
    for i in range(2, len(messages) + 1):
        if messages[i - 1]["role"] != "tool":
            continue
        outcome = process(journal, messages[:i], tools=None, policy=POLICY, model=NO_CACHE, counter=COUNTER)
        journal, sent = outcome.journal, outcome.messages
        reports.append(outcome.report)
    return reports, journal, sent


BASE = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Fix the bug."},
    call(0, "grep -rn read_header_v2 src"),
    output(0, "src/io_utils.py:88: def read_header_v2(raw): return decode_frame_len(raw)"),
    call(1, "ls"),
    output(1, "setup.py"),
    call(2, "cat README.rst"),
    output(2, "demo"),
    call(3, "cat setup.py"),
    output(3, "setup()"),
    call(4, "cat tox.ini"),
    output(4, "[tox]"),
]


def test_using_a_name_only_a_cleared_output_held_is_a_recall_miss():
    reports, journal, sent = turns(
        [*BASE, call(5, "sed -n 80,95p src/other.py", "Edit decode_frame_len."), output(5, "ok")]
    )
    assert PLACEHOLDER in [m["content"] for m in sent if m.get("tool_call_id") == "c0"]
    assert reports[-1].recall_missed >= 1 and reports[-1].reruns == 0
    assert journal.recall.misses == 1


def test_running_a_cleared_call_again_with_the_same_arguments_is_a_rerun():
    reports, journal, _ = turns([*BASE, call(5, "grep -rn read_header_v2 src"), output(5, "again")])
    assert reports[-1].reruns == 1 and journal.recall.reruns == 1


def test_a_name_a_newer_output_holds_again_is_no_miss():
    again = output(5, "src/io_utils.py:88: def read_header_v2(raw): return decode_frame_len(raw)")
    messages = [
        *BASE,
        call(5, "grep -rn read_header src"),
        again,
        call(6, "true", "Edit decode_frame_len."),
        output(6, ""),
    ]
    reports, journal, _ = turns(messages)
    assert reports[-1].recall_missed == 0 and journal.recall.misses == 0


def test_the_index_survives_the_journal_round_trip():
    _, journal, _ = turns(BASE)
    assert journal.recall.removed
    assert Journal.from_dict(journal.to_dict()).recall == journal.recall
