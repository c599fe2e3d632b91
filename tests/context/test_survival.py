"""The turns to come a session's agent's finished sessions predict (a Kaplan-Meier estimate, running ones censored)."""

from __future__ import annotations

import pytest

from proxy.context.economics import TURNS_TO_COME, expected_turns_to_come
from proxy.context.survival import MIN_FINISHED, NO_HISTORY, Lifetimes


def test_no_history_keeps_the_rule_without_it() -> None:
    assert NO_HISTORY.turns_to_come(5) is None
    assert expected_turns_to_come(10) == expected_turns_to_come(10, NO_HISTORY) == TURNS_TO_COME * 10


def test_too_few_finished_sessions_say_nothing() -> None:
    few = Lifetimes.of([10] * (MIN_FINISHED - 1))
    assert few.turns_to_come(3) is None and few.finished == MIN_FINISHED - 1
    assert expected_turns_to_come(4, few) == TURNS_TO_COME * 4


def test_equal_lengths_leave_the_difference_to_come() -> None:
    history = Lifetimes.of([20] * 8)
    assert history.turns_to_come(1) == pytest.approx(19)
    assert history.turns_to_come(15) == pytest.approx(5)
    assert expected_turns_to_come(14, history) == pytest.approx(5)  # 14 replies so far: this is request 15


def test_a_session_that_outlived_the_short_ones_expects_the_long_ones_rest() -> None:
    history = Lifetimes.of([5, 5, 5, 5, 30, 30, 30, 30])
    assert history.turns_to_come(1) == pytest.approx((4 * 4 + 4 * 29) / 8)
    assert history.turns_to_come(10) == pytest.approx(20)  # only the 30s reach request 10


def test_running_sessions_lengthen_the_estimate() -> None:
    finished = [10] * 6
    assert Lifetimes.of(finished, [9] * 6).turns_to_come(5) == pytest.approx(5)  # censored before 10: no news
    longer = Lifetimes.of(finished, [40] * 6)
    assert longer.turns_to_come(5) > 5


def test_past_nearly_every_session_the_history_cannot_say() -> None:
    history = Lifetimes.of([4, 4, 4, 4, 4, 50])
    assert history.turns_to_come(4) is not None
    assert history.turns_to_come(10) is None  # one session reached it: the rule without history
    assert history.turns_to_come(60) is None


def test_assured_turns_are_what_nearly_every_session_that_got_here_outlasted() -> None:
    history = Lifetimes.of([10, 20, 30, 40, 50, 60, 70, 80, 90, 100])
    assert history.assured_turns(1) == 19  # nine in ten reached request 20: 19 turns after the first
    assert history.assured_turns(15) == 5  # all nine that reached 15 reached 20; 8 of 9 (< 0.9) reached 21
    assert NO_HISTORY.assured_turns(5) == 0


def test_a_costly_edit_may_bet_on_the_assured_turns_only() -> None:
    from proxy.context.economics import BEHIND, within_budget

    direct = 1000 / BEHIND  # the session's direct bill so far: the bet may leave it this far behind
    assert not within_budget(cost=500, banked=0, per_turn=100, direct=direct)
    assert within_budget(cost=500, banked=0, per_turn=100, assured_turns=5, direct=direct)
    assert not within_budget(cost=600, banked=0, per_turn=100, assured_turns=5, direct=direct)
