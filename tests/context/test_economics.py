"""The prefix-cache cost model and the rule for when an edit epoch pays (SPEC §3)."""

import pytest

from proxy.context.economics import (
    bill,
    cached_prefix,
    epoch_cost,
    epoch_pays,
    epoch_saving,
    expected_turns_to_come,
)
from tests.context.replay import request_blocks


def test_first_request_is_billed_in_full():
    assert bill([[(b"a", 10), (b"b", 5)]], discount=0.5).billed == 15


def test_a_request_that_extends_the_previous_one_reads_its_prefix_from_the_cache():
    result = bill([[(b"a", 10)], [(b"a", 10), (b"b", 5)]], discount=0.5)
    assert (result.uncached, result.cached) == (15, 10)
    assert result.billed == 20


def test_an_edited_message_rebills_everything_after_it():
    before = [(b"a", 10), (b"b", 20), (b"c", 30)]
    after = [(b"a", 10), (b"B", 2), (b"c", 30)]
    assert cached_prefix(before, after) == 10
    assert bill([before, after], discount=0.1).billed == pytest.approx(60 + 32 + 0.1 * 10)


def test_without_caching_the_bill_is_every_token():
    result = bill([[(b"a", 10)], [(b"a", 10), (b"b", 5)]], discount=1.0)
    assert result.billed == result.total == 25


def test_request_blocks_put_the_tools_schema_first():
    blocks = request_blocks([{"role": "user", "content": "hi"}], [5], tools=[{"type": "function"}], tools_tokens=7)
    assert [n for _, n in blocks] == [7, 5]


def test_epoch_cost_and_saving_follow_the_spec_formula():
    assert epoch_cost(0.5, tokens_after=1000, first_changed=400, freed=200) == pytest.approx(0.5 * 600 - 0.5 * 200)
    assert epoch_saving(0.5, freed=200, turns_to_come=3) == pytest.approx(300)
    assert expected_turns_to_come(10) == 5  # half as many turns to come as have passed (economics.TURNS_TO_COME)


def test_without_caching_any_edit_that_frees_tokens_pays():
    assert epoch_pays(discount=1.0, tokens_after=50000, first_changed=0, freed=1, turns_so_far=0)
    assert not epoch_pays(discount=1.0, tokens_after=50000, first_changed=0, freed=0, turns_so_far=10)


def test_with_cheap_caching_an_early_edit_does_not_pay_but_a_late_one_does():
    early = epoch_pays(discount=0.1, tokens_after=40000, first_changed=1000, freed=2000, turns_so_far=10)
    late = epoch_pays(discount=0.1, tokens_after=40000, first_changed=39000, freed=2000, turns_so_far=10)
    assert not early and late


def test_more_turns_to_come_make_an_edit_pay():
    kwargs = {"discount": 0.5, "tokens_after": 20000, "first_changed": 10000, "freed": 1000}
    assert not epoch_pays(**kwargs, turns_so_far=4)
    assert epoch_pays(**kwargs, turns_so_far=40)
