"""Live recall misses and re-runs: the agent's newest message against what the proxy removed."""

import json

from proxy.context import ClearPolicy, HeuristicCounter, ModelInfo, Policy
from proxy.context.clearing import PLACEHOLDER
from proxy.context.journal import Journal
from proxy.context.pipeline import Outcome, process

COUNTER = HeuristicCounter()
NO_CACHE = ModelInfo(context_window=128000, input_per_mtok=1.0, cached_input_per_mtok=1.0)
POLICY = Policy(clear_tool_outputs=ClearPolicy(keep_tokens=0, keep_under=10, clear_at_least=100, in_use_turns=0))


def call(k: int, command: str, text: str = "") -> dict:
    arguments = json.dumps({"command": command})
    return {"role": "assistant", "content": text, "tool_calls": [{"id": f"c{k}", "function": {"arguments": arguments}}]}


def output(k: int, text: str) -> dict:
    return {"role": "tool", "tool_call_id": f"c{k}", "content": text + " " + "x " * 300}


def outcomes(messages: list[dict], policy: Policy = POLICY) -> list[Outcome]:
    """Send each prefix that ends in a tool output, as an agent would: each turn's outcome."""
    journal, out = Journal(), []
    for i in range(2, len(messages) + 1):
        if messages[i - 1]["role"] == "tool":
            out.append(process(journal, messages[:i], tools=None, policy=policy, model=NO_CACHE, counter=COUNTER))
            journal = out[-1].journal
    return out


def turns(messages: list[dict]) -> tuple[list, Journal, list]:
    """The reports, the last journal and the last request sent."""
    out = outcomes(messages)
    return [o.report for o in out], out[-1].journal, out[-1].messages


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


def kept_outputs(messages: list[dict], miss_keep_tokens: int) -> list[int]:
    """Per turn, how many tool outputs went upstream uncleared, under a policy keeping about three of them."""
    size = COUNTER.count_text(output(0, "")["content"])
    rules = ClearPolicy(
        keep_tokens=3 * size, keep_under=10, clear_at_least=100, in_use_turns=0, miss_keep_tokens=miss_keep_tokens
    )
    return [
        sum(m.get("role") == "tool" and m["content"] != PLACEHOLDER for m in o.messages)
        for o in outcomes(messages, Policy(clear_tool_outputs=rules))
    ]


def test_after_a_recall_miss_clearing_keeps_more_output_and_the_extra_fades():
    later = [m for k in range(6, 40) for m in (call(k, f"cat file{k}.py"), output(k, f"file{k}"))]
    missing = [*BASE, call(5, "sed -n 80,95p src/other.py", "Edit decode_frame_len."), output(5, "ok"), *later]
    plain, adapted = kept_outputs(missing, 0), kept_outputs(missing, 10**6)
    miss = 5  # the turn whose request holds the agent's message quoting what only cleared output 0 held
    assert (plain[miss - 1], plain[miss]) == (adapted[miss - 1], 3) and adapted[miss] > 3  # it keeps more at once
    assert plain[:miss] == adapted[:miss]
    assert all(a > p for a, p in list(zip(adapted, plain, strict=True))[miss + 1 : miss + 6])
    assert adapted[-1] == plain[-1]  # 34 agent messages without a miss: the doubling has faded away
    capped = kept_outputs(missing, COUNTER.count_text(output(0, "")["content"]) * 5)  # room for one more output
    assert all(p <= c <= a for p, c, a in zip(plain, capped, adapted, strict=True))
    assert max(capped) == max(plain) + 1 < max(adapted)


def test_heat_rises_with_a_miss_and_fades_with_each_agent_message():
    missed = [*BASE, call(5, "sed -n 80,95p src/other.py", "Edit decode_frame_len."), output(5, "ok")]
    _, journal, _ = turns(missed)
    assert journal.recall.heat == 1.0
    quiet = [call(6, "true"), output(6, "fine"), call(7, "true"), output(7, "fine")]
    _, journal, _ = turns([*missed, *quiet])
    assert 0.8 < journal.recall.heat < 0.82  # 0.9 twice
    assert Journal.from_dict(journal.to_dict()).recall.heat == journal.recall.heat
