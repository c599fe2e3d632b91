"""Units (a tool call with its results) and pairing checks on chat messages."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.messages import ids_at, indices_of, message_ids, units
from tests.pairing import check_pairing


def call(*ids: str, text: str = "") -> dict[str, Any]:
    calls = [{"id": i, "type": "function", "function": {"name": "bash", "arguments": "{}"}} for i in ids]
    return {"role": "assistant", "content": text, "tool_calls": calls}


def result(call_id: str, text: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def user(text: str = "hi") -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_plain_messages_are_each_their_own_unit() -> None:
    messages = [{"role": "system", "content": "s"}, user(), {"role": "assistant", "content": "a"}]
    assert units(messages) == [(0, 1), (1, 2), (2, 3)]


def test_a_tool_call_and_its_results_form_one_unit() -> None:
    messages = [user(), call("a", "b"), result("a"), result("b"), user()]
    assert units(messages) == [(0, 1), (1, 4), (4, 5)]


def test_results_may_arrive_in_any_order_within_their_group() -> None:
    messages = [call("a", "b"), result("b"), result("a")]
    assert units(messages) == [(0, 3)]
    assert check_pairing(messages) == []


def test_reused_tool_call_ids_pair_by_position() -> None:
    messages = [user(), call("x"), result("x"), call("x"), result("x")]
    assert units(messages) == [(0, 1), (1, 3), (3, 5)]
    assert check_pairing(messages) == []


def test_a_result_answering_an_earlier_group_is_an_orphan() -> None:
    messages = [call("a"), result("a"), call("b"), result("b"), result("a")]
    assert units(messages) == [(0, 2), (2, 4), (4, 5)]
    assert check_pairing(messages) == [
        "message 4: tool result for call 'a' does not follow the assistant message that made the call"
    ]


def test_a_leading_tool_result_is_an_orphan() -> None:
    problems = check_pairing([{"role": "system", "content": "s"}, result("a"), user()])
    assert len(problems) == 1
    assert problems[0].startswith("message 1: tool result for call 'a'")


def test_a_call_without_its_result_is_reported() -> None:
    assert check_pairing([user(), call("a", "b"), result("a")]) == ["message 1: call 'b' has no result"]


def test_a_result_after_another_message_no_longer_pairs() -> None:
    messages = [call("a"), user(), result("a")]
    assert units(messages) == [(0, 1), (1, 2), (2, 3)]
    assert len(check_pairing(messages)) == 2


def test_a_valid_conversation_has_no_problems() -> None:
    assert check_pairing([user(), call("a"), result("a"), {"role": "assistant", "content": "done"}]) == []
    assert check_pairing([]) == []


def test_a_legacy_function_call_and_its_result_go_together():
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "function_call": {"name": "weather", "arguments": "{}"}},
        {"role": "function", "name": "weather", "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ]
    assert units(messages) == [(0, 1), (1, 3), (3, 4)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([bytes([k]) * 16 for k in range(4)]), max_size=30), st.data())
def test_ids_at_and_indices_of_agree_with_message_ids(digests: list[bytes], data: st.DataObject) -> None:
    """A plan's ids are made for its outputs alone (`ids_at`) and found again by comparing digests (`indices_of`):
    both give what `message_ids` of every message gives, repeated digests (which occurrence) included."""
    ids = message_ids([{} for _ in digests], digests)
    picked = data.draw(st.lists(st.integers(0, max(0, len(digests) - 1)), unique=True)) if digests else []
    picked.sort()
    assert ids_at(digests, picked) == [ids[i] for i in picked]
    wanted = [ids[i] for i in picked] + data.draw(st.lists(st.sampled_from(["zz:0", "00" * 16 + ":01", "ab:x"])))
    assert indices_of(wanted, digests) == [i for i, mid in enumerate(ids) if mid in wanted]
