"""Compaction: lines of a tool output that stand in an earlier output still sent point at where they stand."""

from dataclasses import replace

import orjson
import pytest

from proxy.context import ClearPolicy, HeuristicCounter, ModelInfo, Policy
from proxy.context.compact import OWN, REPEATED, Places, Run, StandingIndex, apply, decode, encode
from proxy.context.journal import AS_SENT, CLEARED, COMPACTED, Decision, Journal
from proxy.context.messages import is_tool_output
from proxy.context.patterns import compile_patterns
from proxy.context.pipeline import process
from tests.context.lossless import expanded, missing_lines
from tests.context.replay import TRACE_NAMES, load, model, policy_for, run, turns

COUNTER = HeuristicCounter()
NO_CLEARING = Policy(clear_tool_outputs=ClearPolicy(enabled=False))
UNCACHED = ModelInfo(context_window=128000, input_per_mtok=1.0, cached_input_per_mtok=1.0)


def _file(version: int) -> str:
    lines = [f"    {k}\tdef function_number_{k}(argument): return argument * {k}" for k in range(1, 41)]
    lines[20] = f"    21\tdef function_number_21(argument): return argument + {version}"
    return "\n".join(lines)


def _session() -> list[dict]:
    """An agent that reads a file, edits one line, reads it again, then runs something else."""
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."}]
    for k, body in enumerate((_file(1), "edited", _file(2), "tests passed", "done")):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": body})
    return messages


def _steps(ks: range, tool: str) -> list[dict]:
    """A call of `tool` and its long, distinct output for each k: turns that give clearing something to free."""
    messages: list[dict] = []
    for k in ks:
        call = {"id": f"c{k}", "type": "function", "function": {"name": tool, "arguments": "{}"}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]}]
        messages += [{"role": "tool", "tool_call_id": f"c{k}", "content": f"step {k} " + "x y" * 1200}]
    return messages


def _replay(messages: list[dict], policy: Policy = NO_CLEARING, info: ModelInfo = UNCACHED, restart: bool = False):
    journal, outcomes = Journal(), []
    for i in range(4, len(messages) + 1, 2):
        outcome = process(journal, messages[:i], tools=None, policy=policy, model=info, counter=COUNTER)
        journal = (
            Journal.from_dict(orjson.loads(orjson.dumps(outcome.journal.to_dict()))) if restart else outcome.journal
        )
        outcomes.append(outcome)
    return outcomes


def test_a_file_read_again_reaches_the_upstream_whole_then_points_at_the_first_read_from_the_next_turn_on():
    outcomes = _replay(_session())
    reread = _session()[7]
    arrived, next_turn = outcomes[2], outcomes[3]
    assert arrived.messages[-1] == reread and arrived.report.compacted == 0
    sent = next_turn.messages[7]["content"]
    assert "[20 lines here are lines 1-20 of the output of call c0 above, unchanged]" in sent
    assert "[19 lines here are lines 22-40 of the output of call c0 above, unchanged]" in sent
    assert "argument + 2" in sent and next_turn.report.compacted == 1
    assert len(sent) < len(reread["content"]) / 5
    assert missing_lines(reread, next_turn.messages) == []


def test_a_compacted_output_is_replayed_byte_for_byte_on_later_turns_and_after_a_restart():
    for restart in (False, True):
        outcomes = _replay(_session(), restart=restart)
        assert orjson.dumps(outcomes[4].messages[:10]) == orjson.dumps(outcomes[3].messages[:10])
        assert outcomes[4].journal.decisions[7].kind == COMPACTED and not outcomes[4].report.rewrote_prefix


def test_when_the_output_pointed_at_is_cleared_the_compacted_one_gets_its_lines_back():
    messages = _session()
    messages[6]["tool_calls"][0]["function"]["name"] = "view"  # the second read: a tool never cleared
    messages += _steps(range(5, 10), "bash")
    clears = ClearPolicy(keep_tokens=0, keep_under=0, clear_at_least=900, exclude_tools=("view",))
    outcomes = _replay(messages, policy=Policy(clear_tool_outputs=clears))
    assert outcomes[3].journal.decisions[7].kind == COMPACTED
    cleared = next(o for o in outcomes if o.report.cleared and o.messages[3]["content"].startswith("[output cleared"))
    assert cleared.journal.decisions[7].kind != COMPACTED
    assert cleared.messages[7] == messages[7]


def test_with_cheap_caching_a_compaction_that_frees_little_waits_but_one_that_repays_at_once_is_made():
    cheap = ModelInfo(context_window=128000, input_per_mtok=1.0, cached_input_per_mtok=0.1)
    messages = _session()
    assert _replay(messages, info=cheap)[3].report.compacted == 1  # 40 lines sent as 3: repays on the next turn
    half = [
        *messages[:7],
        {**messages[7], "content": _file(2) + "\n" + _file(3).replace("def", "class")},
        *messages[8:],
    ]
    assert _replay(half, info=cheap)[3].report.compacted == 0
    assert _replay(half, info=UNCACHED)[3].report.compacted == 1


def test_the_index_of_standing_lines_holds_while_the_messages_and_decisions_it_was_built_from_lead():
    """A turn compacts its newest output against where earlier outputs' lines stand; the last turn's index of that
    serves while the journal leads with what it was built from (the very decision objects), and a turn adds only
    the messages new since. What it finds for a line is what `Places` with every output added finds."""
    texts = [_file(1), None, _file(2)]  # two reads of a file and, between them, a message that is no output
    digests, decisions = [bytes([k]) * 16 for k in range(4)], [AS_SENT, AS_SENT, AS_SENT, Decision(CLEARED)]
    index = StandingIndex()
    index.extend(digests, decisions, texts[:1])
    index.extend(digests, decisions, texts[1:])
    places = Places()
    places.add(0, _file(1))
    places.add(2, _file(2))
    line = _file(2).split("\n")[5]

    view = index.places_of({line}, texts.__getitem__)

    assert index.upto == 3 and view.places == {line: places.places[line]} == {line: [(0, 5), (2, 5)]}
    assert view.texts[2] == _file(2).split("\n")
    assert index.leads(digests, decisions) and index.leads(digests[:3], decisions[:3])
    assert not index.leads(digests[:2], decisions[:2])  # a journal cut back before what it indexed
    assert not index.leads([b"x" * 16, *digests[1:]], decisions)  # another history
    assert not index.leads(digests, [AS_SENT, AS_SENT, Decision(COMPACTED, "0+2@0.0"), AS_SENT])  # an edit since
    assert not index.leads(digests, [AS_SENT, replace(AS_SENT), AS_SENT, AS_SENT])  # an equal decision, not the one


def test_a_turn_extends_the_last_turns_index_and_after_an_epoch_a_new_one_is_made():
    """Turn after turn the newest output is compacted against the index the last turn left, extended; an epoch
    that clears outputs it holds changes their decisions, so the turn after it indexes anew."""
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix it."}]
    for k in range(16):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]}]
        messages += [{"role": "tool", "tool_call_id": f"c{k}", "content": _file(k) + f"\nrun {k}: " + "x y " * 300}]
    clearing = Policy(clear_tool_outputs=ClearPolicy(keep_tokens=500, clear_at_least=100))
    journal, kinds, compacted = Journal(), [], 0
    for n in range(6, len(messages) + 1, 2):
        policy = clearing if n == 24 else NO_CLEARING  # one epoch, from a policy that clears, in the middle
        before = journal.standing
        outcome = process(journal, messages[:n], tools=None, policy=policy, model=UNCACHED, counter=COUNTER)
        after = outcome.journal.standing
        kinds.append("epoch" if outcome.report.epoch else "kept" if after is before and after is not None else "new")
        compacted += outcome.report.compacted
        journal = outcome.journal

    assert compacted > 10  # each read of the file pointed at the one before it
    assert kinds.count("epoch") == 1 and kinds.count("kept") >= 10
    assert kinds[kinds.index("epoch") + 1] == "new" and kinds[kinds.index("epoch") + 2] == "kept"


def test_runs_point_into_earlier_outputs_and_fold_a_line_repeated_back_to_back():
    places = Places()
    shared = [f"django/db/backends/module_{k}/operations.py:{k}: def convert_field_to_tz(self):" for k in range(3)]
    places.add(3, "\n".join(["header", *shared, "other"]))
    text = "\n".join(["new", *shared, "warning: retry", "warning: retry", "warning: retry", "end"])
    runs = places.runs(text)
    assert runs == [Run(1, 3, 3, 1), Run(5, 2, REPEATED)]
    assert decode(encode(runs)) == runs
    assert apply(text, runs, {3: "the output of call c3 above"}).split("\n") == [
        "new",
        "[3 lines here are lines 2-4 of the output of call c3 above, unchanged]",
        "warning: retry",
        "[previous line repeated 2 more times]",
        "end",
    ]


def test_a_traceback_printed_twice_in_one_output_points_the_second_time_at_the_first():
    frames = [f'  File "/testbed/django/db/models/module_{k}.py", line {k}, in execute_{k}' for k in range(4)]
    text = "\n".join(["Traceback (most recent call last):", *frames, "ERROR: test_one", "Traceback:", *frames, "end"])
    runs = Places().runs(text)
    assert runs == [Run(7, 4, OWN, 1)]
    assert decode(encode(runs)) == runs
    sent = apply(text, runs, {})
    pointer = "[4 lines here are lines 2-5 of this output, unchanged]"
    assert sent.split("\n")[5:] == ["ERROR: test_one", "Traceback:", pointer, "end"]
    assert expanded([{"role": "tool", "content": sent}], 0) == text


def test_a_run_of_its_own_lines_points_only_at_lines_sent_as_they_are():
    places = Places()
    shared = [f"django/db/backends/module_{k}/operations.py:{k}: def convert_field_to_tz(self):" for k in range(3)]
    places.add(3, "\n".join(shared))
    own = [f"FAILED tests/test_timezones.py::test_convert_field_{k} - AssertionError: naive" for k in range(2)]
    text = "\n".join(["new", *shared, *own, "between", *shared, *own])
    # the first `shared` is sent as a pointer into output 3: the second points there too, not at that pointer
    assert places.runs(text) == [Run(1, 3, 3, 0), Run(7, 3, 3, 0), Run(10, 2, OWN, 2)]
    assert apply(text, places.runs(text), {3: "the output of call c3 above"}).split("\n")[-1] == (
        "[2 lines here are lines 3-4 of this output, unchanged]"
    )


@pytest.mark.parametrize("discount", [1.0, 0.1])
def test_over_every_packaged_trace_every_line_of_every_output_stands_in_the_request(discount, real_counter):
    """With clearing off, compaction and dedup are the only edits at 128k: nothing the agent saw is gone."""
    compacted = 0
    for name in TRACE_NAMES:
        trace = load(name)
        policy = replace(
            policy_for(trace), clear_tool_outputs=replace(policy_for(trace).clear_tool_outputs, enabled=False)
        )
        result = run(trace, policy, model(128000, discount), real_counter)
        compacted += sum(o.report.compacted for o in result.outcomes)
        for request, sent in zip(turns(trace), result.requests, strict=True):
            for message in request:
                assert missing_lines(message, sent) == [], name
    assert compacted >= 3


def _reads(*versions: dict[int, str], shown: tuple[int, int] | None = None) -> list[dict]:
    """An agent that reads a 40-line file once per version, each version the lines it changes; the last read
    shows only lines `shown` (first, last) when given."""
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."}]
    lines = _file(1).split("\n")
    for k, changes in enumerate(versions):
        for number, line in changes.items():
            lines[number - 1] = line
        view = lines[shown[0] - 1 : shown[1]] if shown and k == len(versions) - 1 else lines
        call = {"id": f"c{k}", "type": "function", "function": {"name": "view", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": "\n".join(view)})
    messages.append({"role": "assistant", "content": "done"})
    messages.append({"role": "user", "content": "thanks"})
    return messages


FIRST_EDIT = {n: f"    {n}\tdef function_number_{n}(argument): return argument - {n}  # fixed" for n in (20, 21, 22)}
SECOND_EDIT = {n: f"    {n}\tdef function_number_{n}(argument): return argument ** {n}  # fixed" for n in (35, 36)}


def test_a_third_read_points_at_the_lines_only_the_compacted_second_read_holds():
    messages = _reads({}, FIRST_EDIT, SECOND_EDIT)
    last = _replay(messages)[-1]
    second, third = last.messages[5]["content"], last.messages[7]["content"]
    assert "[19 lines here are lines 1-19 of the output of call c0 above, unchanged]" in second
    assert "[3 lines here are lines 2-4 of the output of call c1 above, unchanged]" in third
    for k in (3, 5, 7):
        assert expanded(last.messages, k) == messages[k]["content"]


def test_when_the_first_read_is_cleared_every_read_pointing_through_it_still_reads_as_the_client_sent_it():
    """The third read shows only the lines the second changed: it would point at the second's lines 2-4 alone
    (the second points at the first for the rest); the turn the first is cleared the second stands whole
    again, and the third points at its lines 20-22 instead."""
    messages = _reads({}, FIRST_EDIT, {}, shown=(20, 22))
    messages[2]["tool_calls"][0]["function"]["name"] = "bash"  # only the first read may be cleared
    messages += _steps(range(3, 9), "view")
    clears = ClearPolicy(keep_tokens=0, keep_under=0, clear_at_least=200, exclude_tools=("view",))
    outcomes = _replay(messages, policy=Policy(clear_tool_outputs=clears))
    assert any(len(o.journal) > 7 and o.journal.decisions[7].kind == COMPACTED for o in outcomes)
    assert outcomes[-1].messages[3]["content"].startswith("[output cleared")
    assert (
        outcomes[-1].messages[7]["content"]
        == "[3 lines here are lines 20-22 of the output of call c1 above, unchanged]"
    )
    for outcome in outcomes:
        for k in (5, 7):
            if k < len(outcome.messages) - 1:
                assert expanded(outcome.messages, k) == messages[k]["content"]


@pytest.mark.parametrize("discount", [1.0, 0.1])
def test_over_every_packaged_trace_each_compacted_output_reads_as_the_client_sent_it_by_its_pointers(
    discount, real_counter
):
    """The default policy, clearing on: a pointer never names lines that stand elsewhere or no longer stand."""
    for name in TRACE_NAMES:
        trace = load(name)
        policy = policy_for(trace)
        patterns = compile_patterns(policy.clear_tool_outputs.observation_patterns)
        result = run(trace, policy, model(128000, discount), real_counter)
        for request, sent, outcome in zip(turns(trace), result.requests, result.outcomes, strict=True):
            for k, decision in enumerate(outcome.journal.decisions):
                if decision.kind == COMPACTED:
                    j = outcome.sources.index(k)
                    outputs = [s >= 0 and is_tool_output(request[s], patterns) for s in outcome.sources]
                    reads = expanded(sent, j, outputs)
                    assert reads == request[k]["content"], (name, k)
