"""Seed `ContextDiff`: added, removed, kept and the tokens to budget, plus its JSON form."""

import json

from hypothesis import given
from hypothesis import strategies as st

from proxy.context import ContextBlock, ContextDiff, HeuristicCounter, build_context_diff


def test_the_default_diff_is_empty():
    assert ContextDiff() == ContextDiff([], [], [], 0)


def test_tokens_estimated_is_computed_from_the_text_when_not_given():
    text = "Run the tests with pytest -q."
    assert ContextBlock("a", text).tokens_estimated == HeuristicCounter().count_text(text)
    assert ContextBlock("a", text, tokens_estimated=3).tokens_estimated == 3


def test_added_are_blocks_present_now_but_absent_at_the_snapshot():
    new = ContextBlock("b", "new")
    diff = build_context_diff([ContextBlock("a", "old")], [ContextBlock("a", "old"), new])
    assert diff.added == [new]


def test_removed_are_anchors_present_at_the_snapshot_but_absent_now():
    diff = build_context_diff([ContextBlock("a", "x"), ContextBlock("b", "y")], [ContextBlock("a", "x")])
    assert diff.removed == ["b"]


def test_kept_carries_anchors_with_no_body():
    diff = build_context_diff([ContextBlock("a", "x")], [ContextBlock("a", "x")])
    assert diff.kept == ["a"] and diff.added == [] and diff.removed == []


def test_a_block_whose_text_changed_under_the_same_anchor_is_added():
    changed = ContextBlock("a", "x, revised")
    diff = build_context_diff([ContextBlock("a", "x")], [changed])
    assert diff.added == [changed] and diff.kept == []
    assert diff.removed == ["a"]  # the old body is gone: kept + removed still account for the snapshot


def test_tokens_estimated_added_sums_over_added():
    added = [ContextBlock("b", "y" * 40), ContextBlock("c", "z", tokens_estimated=7)]
    diff = build_context_diff([ContextBlock("a", "x")], [ContextBlock("a", "x"), *added])
    assert diff.tokens_estimated_added == 10 + 7


def test_to_dict_from_dict_round_trip():
    diff = build_context_diff(
        [ContextBlock("a", "x"), ContextBlock("gone", "y")], [ContextBlock("a", "x"), ContextBlock("b", "z", "capsule")]
    )
    assert ContextDiff.from_dict(json.loads(json.dumps(diff.to_dict()))) == diff
    assert ContextDiff.from_dict({}) == ContextDiff()


def test_summary_is_the_header_value():
    diff = build_context_diff([ContextBlock("a", "x")], [ContextBlock("a", "x"), ContextBlock("b", "yyyy")])
    assert diff.summary() == "added=1 kept=1 removed=0 tokens_added=1"


blocks = st.lists(
    st.builds(ContextBlock, anchor=st.sampled_from("abcdef"), text=st.sampled_from(["x", "y", "zz" * 20])),
    max_size=8,
    unique_by=lambda b: b.anchor,
)


@given(blocks, blocks)
def test_a_diff_partitions_the_blocks(before, now):
    diff = build_context_diff(before, now)
    added = [b.anchor for b in diff.added]
    assert set(added) | set(diff.kept) == {b.anchor for b in now}
    assert set(diff.removed) | set(diff.kept) == {b.anchor for b in before}
    assert not set(added) & set(diff.kept) and not set(diff.removed) & set(diff.kept)
    assert diff.tokens_estimated_added == sum(b.tokens_estimated for b in diff.added)
    assert ContextDiff.from_dict(diff.to_dict()) == diff
    assert build_context_diff(now, now) == ContextDiff(kept=[b.anchor for b in now])
