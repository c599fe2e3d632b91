"""The quality measure (bench/quality.py): what the next agent message used that the request no longer held."""

from __future__ import annotations

import pytest

from bench.quality import SETTINGS, Score, clear_all_but_last, held_out, measure, score
from proxy.context.clearing import PLACEHOLDER
from proxy.demo.traces import Trace
from proxy.tokens.counter import counter_for
from tests.context.replay import TRACE_NAMES, load
from tests.pairing import check_pairing

COUNTER = counter_for("o200k_base")
BY_NAME = {s.name: s for s in SETTINGS}


def total(setting: str, names: list, window: int = 128000, d: float = 1.0) -> Score:
    out = Score()
    for name in names:
        out.add(measure(BY_NAME[setting], load(name), window, d, COUNTER)["score"])
    return out


def test_direct_scores_exactly_zero_on_every_packaged_trace():
    direct = total("direct", list(TRACE_NAMES))
    assert direct.evidence > 1000
    assert direct.lost == direct.old_lost == direct.lost1 == 0


def test_clearing_every_output_but_the_last_loses_all_old_evidence_and_more_than_the_default():
    bound = total("clear all but last", list(TRACE_NAMES))
    default = total("proxy default", list(TRACE_NAMES))
    assert bound.old_evidence > 50
    assert bound.old_rate == 1.0
    assert bound.rate > default.rate and bound.lost1 > default.lost1


def _task(*steps: dict) -> Trace:
    """A run of `steps` after an agent's instructions and its task."""
    opening = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."}]
    return Trace(name="t", source="", tools=None, messages=[*opening, *steps])


def test_a_token_is_lost_only_when_nothing_sent_still_holds_it():
    trace = _task(
        {"role": "assistant", "content": "", "tool_calls": [_call("c1", "grep -n parse_header src")]},
        {"role": "tool", "tool_call_id": "c1", "content": "src/http_utils.py:412: def parse_header(raw):"},
        {"role": "assistant", "content": "", "tool_calls": [_call("c2", "ls")]},
        {"role": "tool", "tool_call_id": "c2", "content": "setup.py README.rst"},
        {"role": "assistant", "content": "", "tool_calls": [_call("c3", "sed -n 412,430p src/http_utils.py")]},
    )
    as_sent = [trace.messages[:i] for i in (2, 4, 6)]
    cleared = [list(r) for r in as_sent]
    cleared[2][3] = {**cleared[2][3], "content": PLACEHOLDER}
    kept, lost = score(trace, as_sent, 10**6), score(trace, cleared, 10**6)
    assert (kept.evidence, kept.lost) == (lost.evidence, 0) == (4, 0)  # 412, src/http_utils.py, its parts
    assert (lost.lost, lost.old_lost, lost.lost3) == (4, 4, 1)


def test_what_stood_only_in_the_agents_own_message_is_lost_once_that_message_is_cut():
    trace = _task(
        {"role": "assistant", "content": "I will write repro_header.py.", "tool_calls": [_call("c1", "ls")]},
        {"role": "tool", "tool_call_id": "c1", "content": "setup.py README.rst"},
        {"role": "assistant", "content": "", "tool_calls": [_call("c2", "python repro_header.py")]},
    )
    as_sent = [trace.messages[:i] for i in (2, 4)]
    cut = [list(r) for r in as_sent]
    cut[1][2] = {**cut[1][2], "content": "I will [... 9 tokens cut ...]"}
    kept, lost = score(trace, as_sent, 10**6), score(trace, cut, 10**6)
    assert (kept.own_evidence, kept.own_lost) == (lost.own_evidence, 0) == (2, 0)  # repro_header.py, repro_header
    assert (lost.own_lost, lost.all_lost3, lost.evidence, lost.lost) == (2, 0, 0, 0)  # no output held them
    assert lost.all_rate == 1.0


def test_held_out_traces_are_not_the_packaged_ones_nor_each_other():
    samples = ("", "sample_a", "sample_b", "sample_c", "others_a", "others_b")
    sets = [{load(p).source for p in held_out(sample)} for sample in samples]
    assert [len(s) for s in sets] == [4, 12, 12, 12, 13, 11]
    seen = {load(n).source for n in TRACE_NAMES}
    for s in sets:
        assert not s & seen
        seen |= s


@pytest.mark.parametrize("path", held_out("others_a") + held_out("others_b"), ids=lambda p: p.stem)
def test_other_agents_runs_pair_every_call_with_its_result_and_end_on_an_answer(path):
    trace = load(path)
    assert not check_pairing(trace.messages[:-1])  # the last answer is never sent
    assert trace.messages[-1]["role"] == "assistant" and trace.source


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_clear_all_but_last_leaves_the_newest_output(name: str):
    trace = load(name)
    request = trace.messages[:-1]
    sent = clear_all_but_last()(request)
    outputs = [m for m in sent if m.get("role") == "tool"]
    if outputs:
        assert outputs[-1]["content"] != PLACEHOLDER


def _call(call_id: str, command: str) -> dict:
    import json

    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }
