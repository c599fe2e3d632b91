"""Seed `ClearToolOutputs`: every documented behaviour, the plan's stability, and a real trace."""

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.context import ClearPlan, ClearPolicy, ClearToolOutputs, HeuristicCounter
from proxy.context.clearing import Cleared
from proxy.context.messages import message_ids

PLACEHOLDER = "[output cleared to fit the context window; run the tool again if needed]"
TRACE = Path(__file__).resolve().parents[2] / "proxy" / "data" / "traces" / "sweagent_marshmallow-1867.json"
COUNTER = HeuristicCounter()


def text_of(tokens: int, head: str = "out") -> str:
    """A text the heuristic counter puts at about `tokens` tokens."""
    return (head + " " + "x" * (4 * tokens))[: 4 * tokens]


def conversation(*outputs: tuple[str, int] | tuple[str, int, str], last: str = "user") -> list[dict]:
    """system, task, then per output an assistant call and its result; then a closing message."""
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."}]
    for n, spec in enumerate(outputs):
        tool, tokens, *head = spec
        call_id = f"call_{n}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": tool, "arguments": "{}"}}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text_of(tokens, *head)})
    if last == "user":
        messages.append({"role": "user", "content": "Go on."})
    return messages


def cleared_indices(messages: list[dict]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("content") == PLACEHOLDER]


def test_placeholder_is_the_exact_text():
    assert ClearToolOutputs.PLACEHOLDER == PLACEHOLDER


def test_default_keeps_the_newest_20k_tokens_and_every_output_under_500():
    default = ClearToolOutputs()
    assert (default.keep_tokens, default.keep_under, default.clear_at_least, default.errors_keep_under) == (
        20000,
        500,
        0,
        None,
    )
    assert default.exclude_tools == () and default.observation_patterns == ()


def test_new_with_keep_tokens_equals_the_serde_form_naming_only_keep_tokens():
    assert ClearToolOutputs.from_dict({"keep_tokens": 8000}) == ClearToolOutputs(8000)


def test_each_size_missing_from_the_serde_form_is_the_defaults():
    assert ClearToolOutputs.from_dict({}) == ClearToolOutputs()
    assert ClearToolOutputs.from_dict({"keep_under": 100}).keep_tokens == 20000


def test_to_dict_round_trips():
    config = ClearToolOutputs(1000, 50, exclude_tools=("open",), clear_at_least=7, errors_keep_under=300)
    assert ClearToolOutputs.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="keep_tokenz"):
        ClearToolOutputs.from_dict({"keep_tokenz": 1})


def test_negative_sizes_are_rejected():
    with pytest.raises(ValueError):
        ClearToolOutputs(keep_tokens=-1)


def test_from_policy_takes_the_policys_knobs():
    policy = ClearPolicy(keep_tokens=8000, keep_under=200, clear_at_least=2000, exclude_tools=("read",))
    config = ClearToolOutputs.from_policy(policy)
    assert (config.keep_tokens, config.keep_under, config.clear_at_least) == (8000, 200, 2000)
    assert config.errors_keep_under == 1000 and config.exclude_tools == ("read",)


def test_the_newest_keep_tokens_of_tool_output_stay_and_older_outputs_are_cleared():
    messages = conversation(("bash", 600), ("bash", 600), ("bash", 600), ("bash", 600))
    result = ClearToolOutputs(keep_tokens=1200).clear(messages)
    assert cleared_indices(messages) == [3, 5]
    assert result.results == 2


def test_an_output_straddling_keep_tokens_is_cleared():
    messages = conversation(("bash", 600), ("bash", 800))
    ClearToolOutputs(keep_tokens=700).clear(messages)
    assert cleared_indices(messages) == [3, 5]


def test_the_last_message_is_never_touched():
    messages = conversation(("bash", 600), ("bash", 5000), last="tool")
    last = copy.deepcopy(messages[-1])
    ClearToolOutputs(keep_tokens=0).clear(messages)
    assert messages[-1] == last and cleared_indices(messages) == [3]


def test_error_outputs_are_never_cleared():
    messages = conversation(("bash", 900, "Traceback"), ("bash", 900, "Error"), ("bash", 900, "error:"), ("bash", 900))
    messages[9]["content"] = json.dumps({"error": "x" * 4000})
    ClearToolOutputs(keep_tokens=0).clear(messages)
    assert cleared_indices(messages) == []


def test_long_errors_are_cleared_like_any_output_when_errors_keep_under_is_set():
    messages = conversation(("bash", 900, "Traceback"), ("bash", 600, "Error"), ("bash", 100))
    ClearToolOutputs(keep_tokens=0, errors_keep_under=800).clear(messages)
    assert cleared_indices(messages) == [3]


def test_error_patterns_are_configurable():
    messages = conversation(("bash", 900, "FAILED"), ("bash", 900, "Traceback"), ("bash", 10))
    ClearToolOutputs(keep_tokens=0, error_patterns=(r"^FAILED",)).clear(messages)
    assert cleared_indices(messages) == [5]


def test_outputs_under_keep_under_are_never_cleared():
    messages = conversation(("bash", 499), ("bash", 501), ("bash", 10))
    ClearToolOutputs(keep_tokens=0, keep_under=500).clear(messages)
    assert cleared_indices(messages) == [5]


def test_outputs_of_excluded_tools_are_never_cleared():
    messages = conversation(("open", 900), ("bash", 900), ("bash", 10))
    ClearToolOutputs(keep_tokens=0, exclude_tools=("open",)).clear(messages)
    assert cleared_indices(messages) == [5]


def test_exempt_outputs_count_toward_the_newest_keep_tokens():
    # The newest output is an excluded tool's: it stays, and it uses up the budget.
    messages = conversation(("bash", 900), ("open", 900), ("bash", 10))
    ClearToolOutputs(keep_tokens=1000, exclude_tools=("open",)).clear(messages)
    assert cleared_indices(messages) == [3]


def test_the_calls_stay_so_the_conversation_keeps_its_shape():
    messages = conversation(("bash", 900), ("bash", 900), ("bash", 10))
    original = copy.deepcopy(messages)
    ClearToolOutputs(keep_tokens=0).clear(messages)
    assert len(messages) == len(original)
    for before, after in zip(original, messages, strict=True):
        if after.get("content") == PLACEHOLDER:
            assert {k: v for k, v in after.items() if k != "content"} == {
                k: v for k, v in before.items() if k != "content"
            }
        else:
            assert after == before


def test_clearing_twice_clears_nothing_more():
    messages = conversation(("bash", 900), ("bash", 900), ("bash", 10))
    config = ClearToolOutputs(keep_tokens=0)
    assert config.clear(messages).results == 2
    assert config.clear(messages) == Cleared(0, 0)
    assert config.plan(messages) == ClearPlan()


def test_cleared_reports_outputs_and_tokens_freed():
    messages = conversation(("bash", 900), ("bash", 900), ("bash", 10))
    sizes = sum(COUNTER.count_message(messages[i]) for i in (3, 5))
    placeholder = COUNTER.count_message({"role": "tool", "tool_call_id": "call_0", "content": PLACEHOLDER})
    result = ClearToolOutputs(keep_tokens=0).clear(messages)
    assert result == Cleared(results=2, tokens=sizes - 2 * placeholder)


def test_a_plan_under_clear_at_least_clears_nothing():
    messages = conversation(("bash", 900), ("bash", 10))
    assert ClearToolOutputs(keep_tokens=0, clear_at_least=5000).clear(messages) == Cleared(0, 0)
    assert cleared_indices(messages) == []
    assert ClearToolOutputs(keep_tokens=0, clear_at_least=800).clear(messages).results == 1


def test_an_output_shorter_than_the_placeholder_is_never_cleared():
    messages = conversation(("bash", 5), ("bash", 5))
    assert ClearToolOutputs(keep_tokens=0, keep_under=0).clear(messages) == Cleared(0, 0)


def test_observation_patterns_mark_user_messages_as_tool_output():
    messages = [
        {"role": "system", "content": "agent"},
        {"role": "user", "content": "Fix the bug " + "y" * 4000},
        {"role": "assistant", "content": "```ls```"},
        {"role": "user", "content": "OBSERVATION:\n" + "x" * 4000},
        {"role": "assistant", "content": "```cat a```"},
        {"role": "user", "content": "go on"},
    ]
    ClearToolOutputs(keep_tokens=0, observation_patterns=(r"^OBSERVATION:",)).clear(messages)
    assert cleared_indices(messages) == [3]


def test_the_plan_names_outputs_by_stable_id():
    messages = conversation(("bash", 900), ("bash", 900), ("bash", 10))
    plan = ClearToolOutputs(keep_tokens=0).plan(messages)
    ids = message_ids(messages)
    assert plan.ids == (ids[3], ids[5]) and plan.indices(messages) == [3, 5]


def test_the_plan_still_applies_once_messages_arrive():
    messages = conversation(("bash", 900), ("bash", 900), ("bash", 10))
    config = ClearToolOutputs(keep_tokens=0)
    plan = config.plan(messages)
    longer = copy.deepcopy(messages) + conversation(("bash", 900))[2:]
    applied = plan.apply(longer)
    assert cleared_indices(longer) == [3, 5] and applied == Cleared(2, plan.tokens)


def test_the_plan_uses_the_counter_it_is_given():
    class Words:
        def count_text(self, text: str) -> int:
            return len(text.split())

        def count_message(self, message: dict) -> int:
            return self.count_text(str(message.get("content") or ""))

    messages = conversation(("bash", 900), ("bash", 10))
    assert ClearToolOutputs(keep_tokens=0, keep_under=2).plan(messages, Words()) == ClearPlan()


def load_trace() -> list[dict]:
    return json.loads(TRACE.read_text())["messages"]


def test_real_trace_clears_the_large_old_outputs_and_replays_turn_to_turn():
    messages = load_trace()
    config = ClearToolOutputs(keep_tokens=2000, keep_under=500)
    requests = [messages[:i] for i, m in enumerate(messages) if m["role"] == "assistant"]
    previous: ClearPlan | None = None
    for request in requests:
        if previous is not None:
            replayed = copy.deepcopy(request)
            previous.apply(replayed)
            assert cleared_indices(replayed) == previous.indices(request)
        current = copy.deepcopy(request)
        plan = config.plan(current)
        result = plan.apply(current)
        assert result == Cleared(len(plan.ids), plan.tokens)
        assert current[-1] == request[-1]
        for before, after in zip(request, current, strict=True):
            if before["role"] != "tool":
                assert after == before
        previous = plan
    final = copy.deepcopy(messages)
    result = config.clear(final)
    # The three outputs over 500 tokens and older than the newest 2000 (setup.py, pip install, fields.py).
    assert cleared_indices(final) == [5, 7, 19]
    assert result.results == 3 and result.tokens > 3000
    assert all(final[i]["tool_call_id"] == messages[i]["tool_call_id"] for i in (5, 7, 19))


conversations = st.lists(
    st.tuples(
        st.sampled_from(["bash", "open", "edit"]),
        st.sampled_from([5, 100, 400, 600, 1500, 4000]),
        st.sampled_from(["out", "out", "Error"]),
    ),
    max_size=12,
)
configs = st.builds(
    ClearToolOutputs,
    keep_tokens=st.sampled_from([0, 500, 2000, 5000]),
    keep_under=st.sampled_from([0, 100, 500]),
    exclude_tools=st.sampled_from([(), ("open",)]),
    clear_at_least=st.sampled_from([0, 1000]),
    errors_keep_under=st.sampled_from([None, 1000]),
)


@given(conversations, configs, st.booleans())
def test_clearing_is_idempotent_and_never_alters_the_last_message(outputs, config, ends_with_tool):
    messages = conversation(*outputs, last="tool" if ends_with_tool else "user")
    last = copy.deepcopy(messages[-1])
    config.clear(messages)
    once = copy.deepcopy(messages)
    assert config.clear(messages) == Cleared(0, 0)
    assert messages == once and messages[-1] == last


@given(conversations, configs, st.data())
def test_a_plan_is_stable_under_appended_messages(outputs, config, data):
    messages = conversation(*outputs, last="user")
    k = data.draw(st.integers(0, len(messages)))
    plan = config.plan(messages[:k])
    full = copy.deepcopy(messages)
    applied = plan.apply(full)
    alone = copy.deepcopy(messages[:k])
    plan.apply(alone)
    assert cleared_indices(full) == cleared_indices(alone) == plan.indices(messages[:k])
    assert applied == Cleared(len(plan.ids), plan.tokens)
    assert full[k:] == messages[k:]
