"""The pipeline turn by turn: stable replay between epochs, rare batched edits, capsules once, real traces."""

import itertools

import orjson
import pytest

from proxy.context import Capsule, CapsulePolicy, ClearPolicy, HeuristicCounter, ModelInfo, Policy
from proxy.context.clearing import PLACEHOLDER
from proxy.context.journal import Journal
from proxy.context.pipeline import process
from tests.context.lossless import missing_lines
from tests.context.replay import TRACE_NAMES, agent, load, model, policy_for, run, turns
from tests.pairing import check_pairing

COUNTER = HeuristicCounter()
POLICY = Policy(clear_tool_outputs=ClearPolicy(keep_tokens=1000, keep_under=100, clear_at_least=500))
NO_CACHE = ModelInfo(context_window=128000, input_per_mtok=1.0, cached_input_per_mtok=1.0)


def replay(messages: list[dict], policy: Policy = POLICY, info: ModelInfo = NO_CACHE, **kwargs):
    """Each turn sends the whole history so far; returns every outcome."""
    journal, outcomes = Journal(), []
    for i in range(2, len(messages) + 1, 2):
        outcome = process(journal, messages[:i], tools=None, policy=policy, model=info, counter=COUNTER, **kwargs)
        journal = outcome.journal
        outcomes.append(outcome)
    return outcomes


def dumped(messages: list[dict]) -> list[bytes]:
    return [orjson.dumps(m) for m in messages]


def test_between_turns_without_an_epoch_the_output_extends_the_previous_one_byte_for_byte():
    outcomes = replay(agent(40))
    for before, after in itertools.pairwise(outcomes):
        if not after.report.epoch:
            assert dumped(after.messages)[: len(before.messages)] == dumped(before.messages)


def test_epochs_are_rare_batches():
    cached = ModelInfo(context_window=128000, input_per_mtok=1.0, cached_input_per_mtok=0.5)
    outcomes = replay(agent(60), policy=Policy(), info=cached)
    epochs = sum(o.report.epoch for o in outcomes)
    assert 1 <= epochs <= len(outcomes) // 3


def test_cleared_outputs_stay_cleared():
    outcomes = replay(agent(40))
    cleared_at: dict[int, int] = {}
    for k, outcome in enumerate(outcomes):
        for i, m in enumerate(outcome.messages):
            if m.get("content") == PLACEHOLDER:
                cleared_at.setdefault(i, k)
        for i, k0 in cleared_at.items():
            assert outcome.messages[i]["content"] == PLACEHOLDER, (i, k0, k)
    assert cleared_at


def test_short_error_outputs_are_never_cleared():
    messages = agent(40, error_every=3)
    last = replay(messages)[-1].messages
    errors = [m for m in last if m.get("role") == "tool" and str(m["content"]).startswith("Error")]
    assert len(errors) == len([m for m in messages if str(m.get("content")).startswith("Error")])


def test_the_last_message_and_the_task_are_never_altered():
    messages = agent(40)
    for outcome, i in zip(replay(messages), range(2, len(messages) + 1, 2), strict=True):
        assert outcome.messages[-1] == messages[i - 1]
        assert {"role": "user", "content": "Fix the bug."} in outcome.messages


def test_regenerating_history_cuts_the_journal():
    messages = agent(10)
    journal = process(Journal(), messages, tools=None, policy=POLICY, model=NO_CACHE, counter=COUNTER).journal
    edited = [*messages[:5], {**messages[5], "content": "something else entirely"}, *messages[6:8]]
    outcome = process(journal, edited, tools=None, policy=POLICY, model=NO_CACHE, counter=COUNTER)
    assert len(outcome.journal) == len(edited)
    assert outcome.journal.digests[:5] == journal.digests[:5]
    assert outcome.journal.digests[5] != journal.digests[5]


def test_process_does_not_mutate_the_journal():
    journal = replay(agent(5))[-1].journal
    before = journal.to_dict()
    process(journal, agent(6), tools=None, policy=POLICY, model=NO_CACHE, counter=COUNTER)
    assert journal.to_dict() == before


def test_a_new_duplicate_output_is_sent_as_a_reference():
    messages = agent(3)
    messages[5] = {**messages[5], "content": messages[3]["content"]}
    out = process(Journal(), messages, tools=None, policy=POLICY, model=NO_CACHE, counter=COUNTER).messages
    assert out[5]["content"] == "[same output as call c0 above]"
    assert out[3] == messages[3]


def test_capsules_are_injected_once_and_replayed_in_place():
    capsules = [Capsule("tests", "convention", "Run the tests with pytest -q before you finish the bug fix.")]
    policy = Policy(capsules=CapsulePolicy(budget_tokens=200))
    outcomes = replay(agent(6), policy=policy, capsules=capsules)
    first = outcomes[0]
    assert first.report.diff.summary().startswith("added=1")
    injected = [m for m in first.messages if "pytest -q" in str(m.get("content"))]
    assert len(injected) == 1 and first.messages.index(injected[0]) == 1
    for outcome in outcomes[1:]:
        assert outcome.report.diff.summary().startswith("added=0 kept=1")
        assert [m for m in outcome.messages if "pytest -q" in str(m.get("content"))] == injected
        assert outcome.messages[1] == injected[0]


def test_a_request_that_cannot_fit_is_rejected_like_openai():
    tiny = ModelInfo(context_window=600, input_per_mtok=1.0, cached_input_per_mtok=1.0)
    policy = Policy(reserve_output_tokens=100)
    outcome = process(Journal(), agent(1, output_tokens=2000), tools=None, policy=policy, model=tiny, counter=COUNTER)
    assert outcome.overflow is not None
    assert outcome.overflow.message().startswith("This model's maximum context length is 600 tokens")


def test_truncation_error_rejects_instead_of_truncating():
    small = ModelInfo(context_window=4000, input_per_mtok=1.0, cached_input_per_mtok=1.0)
    policy = Policy(truncation="error", reserve_output_tokens=500, clear_tool_outputs=ClearPolicy(enabled=False))
    outcome = process(Journal(), agent(20), tools=None, policy=policy, model=small, counter=COUNTER)
    assert outcome.overflow is not None
    assert outcome.report.removed == 0


def test_headers_report_the_turn():
    headers = replay(agent(3))[-1].report.headers()
    assert set(headers) == {"X-Context-Tokens-Before", "X-Context-Tokens-After", "X-Context-Diff", "X-Context-Epoch"}
    assert headers["X-Context-Diff"].startswith("added=0 kept=0 removed=0")


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_every_turn_of_every_trace_fits_a_32k_window_with_valid_pairing(name, real_counter):
    trace = load(name)
    info = model(32000, 0.5)
    policy = policy_for(trace)
    result = run(trace, policy, info, real_counter)
    usable = info.context_window - policy.reserve_output_tokens
    task = next(m for m in trace.messages if m["role"] == "user")
    unchanged = total = 0
    for request, outcome in zip(turns(trace), result.outcomes, strict=True):
        assert outcome.overflow is None
        assert outcome.report.tokens_after <= usable
        assert check_pairing(outcome.messages) == []
        assert outcome.messages[-1] == request[-1]
        assert task in outcome.messages
        sent = set(dumped(outcome.messages))
        # sent as the client wrote it, or compacted: every line of it still standing in the request
        unchanged += sum(orjson.dumps(m) in sent or not missing_lines(m, outcome.messages) for m in request[-6:])
        total += len(request[-6:])
    assert unchanged >= 0.95 * total
    assert sum(o.report.epoch for o in result.outcomes) <= max(2, len(result.outcomes) // 4)


@pytest.mark.parametrize("discount", [1.0, 0.5, 0.1])
def test_the_proxy_never_bills_more_than_direct(discount, real_counter):
    for name in TRACE_NAMES:
        trace = load(name)
        result = run(trace, policy_for(trace), model(128000, discount), real_counter)
        assert result.proxied.billed <= result.direct.billed, name


def test_sources_name_the_client_message_each_output_renders_and_minus_one_for_inserted_ones():
    """What a dialect adapter relies on to render the engine's decisions back into its own API."""
    messages = agent(60)
    small = ModelInfo(context_window=8000, input_per_mtok=1.0, cached_input_per_mtok=1.0)
    outcome = replay(messages, info=small)[-1]
    assert len(outcome.sources) == len(outcome.messages)
    inserted = [out for out, i in zip(outcome.messages, outcome.sources, strict=True) if i < 0]
    assert inserted and all(m["role"] == "system" for m in inserted)  # the omission note
    kept = [i for i in outcome.sources if i >= 0]
    assert kept == sorted(kept) and kept[-1] == len(messages) - 1 and len(kept) < len(messages)  # some dropped
    for out, i in zip(outcome.messages, outcome.sources, strict=True):
        if i >= 0:
            edited = out["role"] == messages[i]["role"] and out["content"] != messages[i]["content"]
            assert out is messages[i] or edited


def codex_session(steps: int, instructions_tokens: int = 3500, task_tokens: int = 3500) -> list[dict]:
    """Codex's shape: a long developer message, `<environment_context>` as the first user message, the task
    after it, then one call and its large output per step."""
    messages = [
        {"role": "developer", "content": "You are Codex. " + "rule " * instructions_tokens},
        {"role": "user", "content": "<environment_context>\n  <cwd>/work</cwd>\n</environment_context>"},
        {"role": "user", "content": "The task: " + "detail " * task_tokens},
    ]
    for message in agent(steps, output_tokens=5000)[2:]:
        messages.append(message)
    return messages


@pytest.mark.parametrize("window", [24000, 32000])
def test_the_instructions_and_the_task_are_never_cut_nor_removed(window: int) -> None:
    messages, journal, edited = codex_session(30), Journal(), 0
    for i in range(3, len(messages) + 1, 2):  # each request ends with the task or a tool output
        outcome = process(
            journal, messages[:i], tools=None, policy=Policy(), model=ModelInfo(context_window=window), counter=COUNTER
        )
        journal, edited = outcome.journal, edited + ("window" in outcome.report.reasons)
        assert outcome.overflow is None
        assert outcome.messages[:3] == messages[:3]
        assert check_pairing(outcome.messages) == []
    assert edited  # the window did force edit epochs


def _step(n: int, output: str) -> list[dict]:
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {n}}}'}}
    ]}  # fmt: skip
    return [call, {"role": "tool", "tool_call_id": f"c{n}", "content": output}]


def test_the_newest_output_is_left_whole_when_a_reminder_follows_it():
    """Claude Code sends a system reminder after the newest tool results (Haiku 5.5 on every turn): the newest
    output is then not the last message, and was cut like any old one, so the agent never read it whole."""
    lines = "".join(f"{i:05d} checked {i * 7919 % 10007}\n" for i in range(1500))
    reminder = {"role": "system", "content": "<system-reminder>tokens left</system-reminder>"}
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": "the task"}]
    messages += _step(0, "first " + lines) + _step(1, "second " + lines) + [reminder]
    small = ModelInfo(context_window=16_000, input_per_mtok=1.0, cached_input_per_mtok=0.1)
    outcome = process(Journal(), messages, tools=None, policy=Policy(), model=small, counter=COUNTER)
    assert outcome.report.epoch and outcome.overflow is None
    newest = [m for m in outcome.messages if m.get("tool_call_id") == "c1"]
    assert newest == [messages[5]], "the newest output was edited before the agent read it"


def test_a_reply_that_stops_at_the_window_keeps_only_the_policys_room_free():
    """Claude from 4.5 on stops a reply at the window instead of refusing a max_tokens that does not fit:
    Claude Code's 128k max_tokens then leaves the prompt the window but `reserve_output_tokens`."""
    messages = [{"role": "user", "content": "the task " * 3000}]  # ~6k tokens
    counted = ModelInfo(context_window=40_000)
    stops = ModelInfo(context_window=40_000, max_tokens_in_window=False)
    run = {"tools": None, "policy": Policy(), "counter": COUNTER, "max_output_tokens": 128_000}
    refused = process(Journal(), messages, model=counted, **run).overflow
    assert refused is not None and refused.reserve == 128_000
    fits = process(Journal(), messages, model=stops, **run)
    assert fits.overflow is None and fits.messages == messages
    too_long = process(Journal(), messages * 8, model=stops, **run).overflow  # ~48k: past 40k - 4096
    assert too_long is not None and (too_long.window, too_long.reserve) == (40_000 - 4096, 0)
    small = process(Journal(), messages, model=stops, **{**run, "max_output_tokens": 1000})
    assert small.overflow is None


def test_a_client_rewriting_a_result_whose_call_an_epoch_dropped_gets_the_call_decided_again_with_it():
    """Claude Code clears old tool results itself once its context grows: the rewritten result is new to the
    journal, but its call, which an earlier epoch dropped, was replayed dropped, and the result went upstream with
    no call before it (the upstream refuses that). The call and its result are decided anew, together."""
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": "the task"}]
    for n in range(24):
        messages += _step(n, "".join(f"{n}.{k} value {(n * 300 + k) * 7919 % 100003}\n" for k in range(300)))
    small = ModelInfo(context_window=16_000, input_per_mtok=1.0, cached_input_per_mtok=0.1)
    policy = Policy(clear_tool_outputs=ClearPolicy(enabled=False))  # the window is kept by truncation alone
    journal = Journal()
    for end in range(4, len(messages) + 1, 2):
        journal = process(journal, messages[:end], tools=None, policy=policy, model=small, counter=COUNTER).journal
    dropped = next(i for i in range(2, len(messages), 2) if journal.decisions[i].kind == "dropped")
    assert journal.decisions[dropped + 1].kind == "dropped"  # a whole unit went in an epoch
    rewritten = [*messages]
    rewritten[dropped + 1] = {**messages[dropped + 1], "content": "[Old tool result content cleared]"}

    outcome = process(journal, rewritten, tools=None, policy=policy, model=small, counter=COUNTER)

    assert check_pairing(outcome.messages) == []
    assert outcome.overflow is None
