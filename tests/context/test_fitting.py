"""The window policy on chat messages: strategies, protections, notes, oversized cuts, real traces."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.fitting import (
    cut_oversized,
    fit_messages,
    never_cut,
    omission_note,
    oversized_limit,
    protected,
    removable_units,
    task_length,
)
from proxy.context.messages import Message, content_text
from proxy.context.policy import TRUNCATIONS
from proxy.context.tokens import Counter, HeuristicCounter
from tests.pairing import check_pairing

TRACES = Path(__file__).resolve().parents[2] / "proxy" / "data" / "traces"
COUNTER = HeuristicCounter()
NOTE_TOKENS = {n: COUNTER.count_message(omission_note(n)) for n in range(1, 1000)}


def oversized_cuts(messages: Sequence[Message], counter: Counter, max_tokens: int) -> dict[int, Message]:
    """Index → cut copy for every oversized message but the last (the one the model must answer)."""
    cuts: dict[int, Message] = {}
    for i, message in enumerate(messages[:-1]):
        cut = cut_oversized(message, counter, max_tokens)
        if cut is not None:
            cuts[i] = cut
    return cuts


def sys(text: str = "rules") -> dict[str, Any]:
    return {"role": "system", "content": text}


def user(text: str = "task") -> dict[str, Any]:
    return {"role": "user", "content": text}


def say(text: str = "thinking") -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def call(*ids: str, text: str = "") -> dict[str, Any]:
    calls = [{"id": i, "type": "function", "function": {"name": "bash", "arguments": "{}"}} for i in ids]
    return {"role": "assistant", "content": text, "tool_calls": calls}


def result(call_id: str, text: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def fit(messages: list[dict[str, Any]], counts: list[int], target: int, strategy: str = "truncate_left", **kw: Any):
    return fit_messages(messages, counts, budget=kw.pop("budget", 1000), target=target, strategy=strategy, **kw)


def removed_indices(keep: list[bool]) -> list[int]:
    return [i for i, kept in enumerate(keep) if not kept]


# sys, task, then five assistant turns of 100 tokens each, ending with a tool result.
AGENT = [sys(), user(), say("a"), say("b"), say("c"), say("d"), call("x"), result("x")]
AGENT_COUNTS = [10, 10, 100, 100, 100, 100, 50, 50]


def test_nothing_is_removed_when_within_target() -> None:
    result_ = fit(AGENT, AGENT_COUNTS, target=520)
    assert result_.keep == [True] * len(AGENT)
    assert (result_.removed, result_.tokens, result_.note, result_.fits) == (0, 520, None, True)
    assert result_.apply(AGENT) == AGENT


def test_truncate_left_removes_the_oldest_units_first() -> None:
    result_ = fit(AGENT, AGENT_COUNTS, target=350)
    assert removed_indices(result_.keep) == [2, 3]
    assert result_.tokens == 320 + NOTE_TOKENS[2]


def test_truncate_right_removes_the_newest_units_but_keeps_the_tail() -> None:
    result_ = fit(AGENT, AGENT_COUNTS, target=350, strategy="truncate_right")
    assert removed_indices(result_.keep) == [4, 5]
    assert result_.apply(AGENT)[-2:] == AGENT[-2:]


def test_middle_out_removes_from_the_middle_keeping_both_ends() -> None:
    result_ = fit(AGENT, AGENT_COUNTS, target=350, strategy="middle_out")
    assert removed_indices(result_.keep) == [3, 4]
    assert [m["content"] for m in result_.apply(AGENT)[2:4]] == ["a", omission_note(2)["content"]]


def test_error_strategy_removes_nothing_and_reports_whether_it_fits() -> None:
    over = fit(AGENT, AGENT_COUNTS, target=100, budget=500, strategy="error")
    assert (over.removed, over.tokens, over.fits, over.note) == (0, 520, False, None)
    under = fit(AGENT, AGENT_COUNTS, target=100, budget=600, strategy="error")
    assert (under.removed, under.fits) == (0, True)


def test_an_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown truncation strategy"):
        fit(AGENT, AGENT_COUNTS, target=100, strategy="truncate_sideways")


def test_counts_must_match_the_messages() -> None:
    with pytest.raises(ValueError, match="counts"):
        fit(AGENT, AGENT_COUNTS[:-1], target=100)


def test_a_tool_call_and_its_results_go_together() -> None:
    messages = [sys(), user(), call("a", "b"), result("a"), result("b"), say("x"), user("go on"), say("y")]
    result_ = fit(messages, [10, 10, 10, 10, 10, 10, 10, 10], target=65)
    assert removed_indices(result_.keep) == [2, 3, 4]
    assert check_pairing(result_.apply(messages)) == []


def test_system_and_developer_messages_are_never_removed() -> None:
    messages = [sys(), say("a"), {"role": "developer", "content": "d"}, say("b"), user(), say("c")]
    result_ = fit(messages, [100] * 6, target=0, budget=300, pin_first_user=False)
    assert removed_indices(result_.keep) == [1, 3]
    assert result_.fits is False


def test_the_first_user_message_is_pinned() -> None:
    messages = [sys(), user("task"), say("a"), user("more"), say("b")]
    assert removed_indices(fit(messages, [10] * 5, target=0).keep) == [2]


def test_the_first_user_message_may_go_when_not_pinned() -> None:
    messages = [sys(), user("task"), say("a"), user("more"), say("b")]
    assert removed_indices(fit(messages, [10] * 5, target=0, pin_first_user=False).keep) == [1, 2]


def test_the_last_user_message_is_never_removed() -> None:
    messages = [user("task"), say("a"), user("hint"), say("b"), call("x"), result("x")]
    for strategy in ("truncate_left", "truncate_right", "middle_out"):
        assert fit(messages, [10] * 6, target=0, strategy=strategy).keep[2]


def test_the_unit_holding_the_last_message_is_never_removed() -> None:
    messages = [user(), say("a"), call("x", "y"), result("x"), result("y")]
    assert removed_indices(fit(messages, [10] * 5, target=0, strategy="truncate_right").keep) == [1]
    assert removable_units(messages) == [(1, 2)]


def test_removal_stops_at_the_low_water_mark() -> None:
    # Under the budget (the high-water mark is the caller's), yet above target: remove down to target.
    result_ = fit(AGENT, AGENT_COUNTS, target=250, budget=600)
    assert result_.tokens <= 250
    assert result_.removed == 3
    one_fewer = sum(AGENT_COUNTS) - 200 + NOTE_TOKENS[2]
    assert one_fewer > 250


def test_the_note_says_how_many_messages_were_omitted_and_sits_where_they_were() -> None:
    messages = [sys(), user(), call("a"), result("a"), say("b"), say("c")]
    result_ = fit(messages, [10, 10, 50, 50, 50, 10], target=100)
    assert result_.note == {"role": "system", "content": "[2 earlier messages omitted]"}
    assert result_.note_index == 2
    assert result_.apply(messages) == [sys(), user(), result_.note, say("b"), say("c")]


def test_the_note_role_can_be_user_for_strict_chat_templates() -> None:
    result_ = fit(AGENT, AGENT_COUNTS, target=350, note_role="user")
    assert result_.note == {"role": "user", "content": "[2 earlier messages omitted]"}


def test_the_note_and_fixed_tokens_count_toward_the_total() -> None:
    result_ = fit(AGENT, AGENT_COUNTS, target=400, fixed_tokens=40)
    kept = sum(c for c, kept in zip(AGENT_COUNTS, result_.keep, strict=True) if kept)
    assert result_.tokens == kept + 40 + COUNTER.count_message(result_.note)


def test_when_the_budget_cannot_be_met_everything_removable_is_removed() -> None:
    result_ = fit(AGENT, AGENT_COUNTS, target=100, budget=120)
    assert removed_indices(result_.keep) == [2, 3, 4, 5]
    assert result_.fits is False


def test_the_first_kept_non_system_message_is_never_an_orphan_tool_result() -> None:
    messages = [sys(), call("a", "b"), result("a"), result("b"), say("x"), user("go"), say("y")]
    result_ = fit(messages, [10, 100, 100, 100, 10, 10, 10], target=100, pin_first_user=False)
    first = next(m for m in result_.apply(messages) if m["role"] != "system")
    assert first["role"] != "tool"
    assert check_pairing(result_.apply(messages)) == []


# -- oversized messages -------------------------------------------------------------


LONG = "\n".join(f"line {i}: " + "word " * 20 for i in range(2000))


def test_a_message_within_the_limit_is_not_cut() -> None:
    assert cut_oversized(say("short"), COUNTER, 100) is None
    assert cut_oversized({"role": "assistant", "content": None}, COUNTER, 1) is None


def test_an_oversized_message_keeps_its_head_and_tail_around_a_marker() -> None:
    cut = cut_oversized(say(LONG), COUNTER, 1000)
    assert cut is not None
    text = cut["content"]
    assert text.startswith("line 0: ") and text.endswith(LONG[-50:])
    assert "tokens cut ...]" in text
    assert COUNTER.count_text(text) <= 1000
    head, _, rest = text.partition("\n[... ")
    tail = rest.partition(" tokens cut ...]\n")[2]
    assert abs(COUNTER.count_text(head) - COUNTER.count_text(tail)) < 100


def test_the_marker_says_how_many_tokens_were_cut() -> None:
    text = cut_oversized(say(LONG), COUNTER, 1000)["content"]
    head, _, rest = text.partition("\n[... ")
    n, _, tail = rest.partition(" tokens cut ...]\n")
    assert int(n) == COUNTER.count_text(LONG) - COUNTER.count_text(head) - COUNTER.count_text(tail)


def test_cutting_is_deterministic() -> None:
    first = cut_oversized(user(LONG), COUNTER, 777)
    assert json.dumps(first) == json.dumps(cut_oversized(user(LONG), COUNTER, 777))


def test_list_of_text_parts_content_is_cut() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    message = {
        "role": "user",
        "content": [{"type": "text", "text": LONG[:40000]}, image, {"type": "text", "text": LONG}],
    }
    cut = cut_oversized(message, COUNTER, 500)
    assert cut is not None
    assert [p["type"] for p in cut["content"]] == ["text", "image_url"]
    assert COUNTER.count_text(content_text(cut)) <= 500
    assert message["content"][0]["text"] == LONG[:40000]  # the input is not changed


def test_tool_call_arguments_are_never_cut() -> None:
    huge = call("a", text=LONG)
    huge["tool_calls"][0]["function"]["arguments"] = json.dumps({"command": LONG})
    cut = cut_oversized(huge, COUNTER, 500)
    assert cut["tool_calls"] == huge["tool_calls"]
    only_arguments = call("a")
    only_arguments["tool_calls"][0]["function"]["arguments"] = json.dumps({"command": LONG})
    assert cut_oversized(only_arguments, COUNTER, 500) is None


def test_a_tiny_allowance_leaves_only_the_marker() -> None:
    assert cut_oversized(say(LONG), COUNTER, 3)["content"].startswith("[... ")


def test_the_last_message_is_never_cut() -> None:
    messages = [user(LONG), say(LONG), result("x", LONG)]
    assert sorted(oversized_cuts(messages, COUNTER, 1000)) == [0, 1]


def test_the_oversized_limit_is_a_share_of_the_usable_window() -> None:
    assert oversized_limit(32000, 0.125) == 4000
    assert oversized_limit(10, 0.0) == 1


def test_a_54k_token_message_fits_a_32k_window_once_cut() -> None:
    # The shipped trace tops out at ~2.7k tokens per message, so the 54k-token assistant
    # message is made from its own tool outputs, inside the unit the last message protects.
    messages = load_trace("mini_django-11138.tools.json")[:40]
    assert messages[-2]["role"] == "assistant" and messages[-1]["role"] == "tool"
    outputs = "\n".join(m["content"] for m in messages if m["role"] == "tool")
    huge = (outputs * (54000 * 4 // len(outputs) + 1))[: 54000 * 4]
    messages[-2] = {**messages[-2], "content": huge}
    counts = [COUNTER.count_message(m) for m in messages]
    assert max(counts) > 54000
    assert not fit_messages(messages, counts, budget=32000, target=19200, strategy="truncate_left").fits
    for i, cut in oversized_cuts(messages, COUNTER, oversized_limit(32000, 0.125)).items():
        messages[i] = cut
    counts = [COUNTER.count_message(m) for m in messages]
    result_ = fit_messages(messages, counts, budget=32000, target=19200, strategy="truncate_left")
    assert result_.fits and result_.tokens <= 19200
    assert check_pairing(result_.apply(messages)) == []


# -- real traces, turn by turn ----------------------------------------------------------


def load_trace(name: str) -> list[dict[str, Any]]:
    return json.loads((TRACES / name).read_text())["messages"]


@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.glob("*.json")))
@pytest.mark.parametrize("strategy", ["truncate_left", "truncate_right", "middle_out"])
def test_every_turn_of_the_real_traces_fits_a_32k_window_with_valid_pairing(name: str, strategy: str) -> None:
    messages = load_trace(name)
    counts = [COUNTER.count_message(m) for m in messages]
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert turns
    for i in turns:
        prefix = messages[:i]
        result_ = fit_messages(prefix, counts[:i], budget=32000, target=19200, strategy=strategy)
        out = result_.apply(prefix)
        assert check_pairing(out) == [], (name, i)
        assert result_.fits and out[-1] is prefix[-1]
        assert next(m for m in out if m["role"] != "system")["role"] != "tool"


# -- properties ---------------------------------------------------------------------------


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Valid conversations; call ids repeat across turns, as real agents' do."""
    messages = [sys("s" * draw(st.integers(0, 200)))] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["user", "say", "calls", "calls", "system"]))
        text = "w" * draw(st.integers(0, 600))
        if kind == "calls":
            ids = [f"call_{j}" for j in range(draw(st.integers(1, 3)))]
            messages.append(call(*ids, text=text))
            messages.extend(result(i, "r" * draw(st.integers(0, 600))) for i in draw(st.permutations(ids)))
        else:
            messages.append({"user": user, "say": say, "system": sys}[kind](text))
    return messages


@settings(max_examples=300, deadline=None)
@given(
    conversations(),
    st.sampled_from(TRUNCATIONS),
    st.booleans(),
    st.integers(0, 200),
    st.floats(0, 1.2),
    st.floats(0, 1),
)
def test_fitting_keeps_every_invariant(messages, strategy, pin, fixed, budget_share, target_share) -> None:
    counts = [COUNTER.count_message(m) for m in messages]
    total = sum(counts) + fixed
    budget = int(total * budget_share)
    target = int(budget * target_share)
    before = json.dumps(messages)
    result_ = fit_messages(
        messages, counts, budget=budget, target=target, strategy=strategy, pin_first_user=pin, fixed_tokens=fixed
    )
    out = result_.apply(messages)
    assert json.dumps(messages) == before
    assert check_pairing(out) == []
    assert out[-1] == messages[-1]
    assert all(kept for m, kept in zip(messages, result_.keep, strict=True) if m["role"] == "system")
    kept_non_system = [m for m, kept in zip(messages, result_.keep, strict=True) if kept and m["role"] != "system"]
    assert not kept_non_system or kept_non_system[0]["role"] != "tool"
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    assert not users or result_.keep[users[-1]]
    assert not (users and pin) or result_.keep[users[0]]
    note = COUNTER.count_message(result_.note) if result_.note else 0
    assert result_.tokens == sum(c for c, k in zip(counts, result_.keep, strict=True) if k) + fixed + note
    assert result_.fits == (result_.tokens <= budget)
    assert result_.removed == result_.keep.count(False)
    if strategy != "error" and total > target:
        left = [u for u in removable_units(messages, pin) if result_.keep[u[0]]]
        assert result_.tokens <= target or not left


def test_the_task_is_every_message_before_the_agents_first_reply() -> None:
    env = user("<environment_context><cwd>/work</cwd></environment_context>")
    messages = [sys(), env, user("the task"), call("x"), result("x"), say("a"), user("more"), say("b"), user("last")]
    assert task_length(messages) == 3
    assert [i for i, pinned in enumerate(protected(messages)) if pinned] == [0, 1, 2, 8]
    assert never_cut(messages) == [True, True, True] + [False] * 6
    assert never_cut(messages, pin_task=False) == [True] + [False] * 8
    assert task_length([say("hello"), user("task"), say("ok")]) == 2  # at least the first user message


def test_the_agents_newest_step_stays_when_a_reminder_follows_its_results() -> None:
    """Claude Code puts a system message (and reminders) after the newest tool results: the last message and the
    last user message are then not that step, and truncating it made the agent ask for the same step forever."""
    big = "x " * 4000
    messages = [sys(), user("the task"), call("a"), result("a", big), call("b"), result("b", big), sys("reminder")]
    counts = [COUNTER.count_message(m) for m in messages]
    fitted = fit_messages(messages, counts, budget=10, target=10, strategy="truncate_left")
    kept = [m for m, keep in zip(messages, fitted.keep, strict=True) if keep]
    assert call("b") in kept and result("b", big) in kept, "the newest call and its result were removed"
    assert call("a") not in kept, "the older step was removable and the target was not reached"
    assert not fitted.fits  # over budget with the step kept: the caller cuts oversized messages or refuses
