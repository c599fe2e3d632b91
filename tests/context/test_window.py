"""Seed `ContextWindow`: every documented behaviour, then the invariants as properties."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.context import ContextError, ContextWindow, TruncationStrategy

LEFT, RIGHT, MIDDLE = TruncationStrategy.TRUNCATE_LEFT, TruncationStrategy.TRUNCATE_RIGHT, TruncationStrategy.MIDDLE_OUT


def test_new_window_is_empty_with_the_given_strategy():
    window = ContextWindow(8, RIGHT)
    assert window.is_empty() and window.len() == 0 and len(window) == 0
    assert window.system_tokens == [] and window.conversation == [] and window.strategy is RIGHT
    assert ContextWindow(8).strategy is LEFT


def test_set_system_prompt_larger_than_the_window_is_an_error():
    window = ContextWindow(3)
    with pytest.raises(ContextError):
        window.set_system_prompt([1, 2, 3, 4])
    assert window.system_tokens == []


def test_system_prompt_equal_to_the_window_fits():
    window = ContextWindow(3)
    window.set_system_prompt([1, 2, 3])
    assert window.tokens() == [1, 2, 3] and window.is_at_limit() and window.remaining_capacity() == 0


def test_set_system_prompt_truncates_the_conversation_to_fit():
    window = ContextWindow(5)
    window.append([1, 2, 3, 4])
    window.set_system_prompt([9, 9])
    assert window.tokens() == [9, 9, 2, 3, 4]


def test_append_within_capacity_appends_everything():
    window = ContextWindow(10)
    assert window.append([1, 2, 3]) == 3
    assert window.conversation == [1, 2, 3] and window.remaining_capacity() == 7


def test_truncate_left_drops_the_oldest_tokens():
    window = ContextWindow(5, LEFT)
    window.append([1, 2, 3, 4])
    assert window.append([5, 6, 7]) == 3
    assert window.conversation == [3, 4, 5, 6, 7]


def test_truncate_left_keeps_the_newest_part_of_an_oversized_append():
    window = ContextWindow(3, LEFT)
    assert window.append([1, 2, 3, 4, 5]) == 3
    assert window.conversation == [3, 4, 5]


def test_truncate_right_drops_the_newest_tokens():
    window = ContextWindow(5, RIGHT)
    window.append([1, 2, 3, 4])
    assert window.append([5, 6, 7]) == 1
    assert window.conversation == [1, 2, 3, 4, 5]
    assert window.append([8]) == 0


def test_middle_out_drops_from_the_middle_keeping_both_ends():
    window = ContextWindow(6, MIDDLE)
    window.append([1, 2, 3, 4, 5])
    assert window.append([6, 7, 8, 9]) == 3
    assert window.conversation == [1, 2, 3, 7, 8, 9]


def test_system_tokens_are_never_truncated():
    for strategy in TruncationStrategy:
        window = ContextWindow(4, strategy)
        window.set_system_prompt([0, 0])
        window.append([1, 2, 3, 4, 5])
        assert window.system_tokens == [0, 0] and window.tokens()[:2] == [0, 0] and window.len() == 4


def test_truncate_to_fit_returns_how_many_tokens_were_removed():
    window = ContextWindow(10)
    window.append(list(range(8)))
    assert window.truncate_to_fit() == 0
    window.max_tokens = 5
    assert window.truncate_to_fit() == 3 and window.conversation == [3, 4, 5, 6, 7]


def test_tokens_is_system_then_conversation_and_always_within_max_tokens():
    window = ContextWindow(6)
    window.set_system_prompt([0])
    window.append([1, 2, 3])
    assert window.tokens() == [0, 1, 2, 3]
    window.max_tokens = 3  # edited by hand: tokens() still fits, the fields are untouched
    assert window.tokens() == [0, 2, 3] and window.conversation == [1, 2, 3]


def test_len_counts_system_and_conversation():
    window = ContextWindow(10)
    window.set_system_prompt([0, 0])
    window.append([1, 2, 3])
    assert window.len() == len(window) == 5


def test_is_empty_only_without_system_prompt_and_conversation():
    window = ContextWindow(10)
    window.set_system_prompt([0])
    assert not window.is_empty()
    window.set_system_prompt([])
    window.append([1])
    assert not window.is_empty()


def test_remaining_capacity_is_what_can_be_appended_before_truncation():
    window = ContextWindow(10)
    window.set_system_prompt([0, 0])
    window.append([1, 2, 3])
    assert window.remaining_capacity() == 5


def test_is_at_limit_when_full():
    window = ContextWindow(3)
    window.append([1, 2])
    assert not window.is_at_limit()
    window.append([3])
    assert window.is_at_limit()


def test_clear_conversation_keeps_the_system_prompt():
    window = ContextWindow(10)
    window.set_system_prompt([0, 0])
    window.append([1, 2, 3])
    window.clear_conversation()
    assert window.conversation == [] and window.system_tokens == [0, 0]


def test_utilization_is_len_over_max_tokens():
    window = ContextWindow(8)
    window.append([1, 2])
    assert window.utilization() == pytest.approx(0.25)


def test_utilization_is_zero_for_a_zero_sized_window():
    window = ContextWindow(0)
    assert window.append([1, 2]) == 0
    assert window.utilization() == 0.0 and window.tokens() == []


operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 30)),
        st.tuples(st.just("system"), st.integers(0, 30)),
        st.tuples(st.just("clear"), st.just(0)),
    ),
    max_size=20,
)


@given(st.integers(0, 40), st.sampled_from(list(TruncationStrategy)), operations)
def test_the_window_is_never_exceeded_and_append_reports_what_stays(max_tokens, strategy, ops):
    window = ContextWindow(max_tokens, strategy)
    next_token = 1
    for op, n in ops:
        if op == "append":
            new = list(range(next_token, next_token + n))
            next_token += n
            before = list(window.conversation)
            appended = window.append(new)
            assert appended == len([t for t in window.conversation if t in set(new)])
            assert _is_subsequence(window.conversation, before + new)
        elif op == "system":
            system = [0] * n
            if n > max_tokens:
                with pytest.raises(ContextError):
                    window.set_system_prompt(system)
            else:
                window.set_system_prompt(system)
                assert window.system_tokens == system
        else:
            window.clear_conversation()
        assert window.len() <= max_tokens and len(window.tokens()) <= max_tokens
        assert window.tokens() == window.system_tokens + window.conversation


@given(st.integers(1, 40), st.sampled_from(list(TruncationStrategy)), st.lists(st.integers(0, 20), max_size=10))
def test_system_tokens_are_never_truncated_by_appends(max_tokens, strategy, sizes):
    window = ContextWindow(max_tokens, strategy)
    system = list(range(-max_tokens // 2, 0))
    window.set_system_prompt(system)
    for n in sizes:
        window.append([7] * n)
        assert window.system_tokens == system and window.tokens()[: len(system)] == system


def _is_subsequence(short: list[int], long: list[int]) -> bool:
    it = iter(long)
    return all(any(x == y for y in it) for x in short)
