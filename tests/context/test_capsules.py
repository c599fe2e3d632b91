"""Seed `ContextRequest`: kinds filter, lexical score, boosts, min_score, budget and cap."""

from hypothesis import given
from hypothesis import strategies as st

from proxy.context import Capsule, ContextBundle, ContextRequest, HeuristicCounter, select_capsules
from proxy.context.capsules import ROLE_BOOST, TAG_BOOST

COUNTER = HeuristicCounter()

PYTEST = Capsule("tests", "convention", "Run the tests with pytest -q before committing.")
BLACK = Capsule("format", "convention", "Format code with black and keep lines under 120 columns.")
FAILURE = Capsule("flaky", "failure_pattern", "The network tests are flaky; rerun them once before debugging.")


def ids(bundle: ContextBundle) -> list[str]:
    return [c.id for c in bundle.capsules]


def scores(request: ContextRequest, capsules: list[Capsule]) -> float:
    return select_capsules(request, capsules).top_score


def test_request_defaults_are_the_seeds():
    request = ContextRequest("q", 100)
    assert (request.stage, request.tags, request.min_score, request.max_capsules) == ("", [], 0.0, 0)
    assert request.prefer_roles == [] and request.kinds == []


def test_capsule_defaults():
    capsule = Capsule("a", "note", "text")
    assert (capsule.tags, capsule.confidence, capsule.freshness, capsule.scope_weight) == ([], 1.0, 1.0, 1.0)


def test_relevant_capsules_score_above_irrelevant_ones():
    bundle = select_capsules(ContextRequest("how do I run the tests with pytest", 1000), [BLACK, PYTEST])
    assert ids(bundle) == ["tests", "format"]


def test_relevance_is_normalised_so_scores_stay_within_one_without_boosts():
    request = ContextRequest("run tests pytest before committing", 1000)
    assert 0.0 < scores(request, [PYTEST, BLACK, FAILURE]) <= 1.0


def test_confidence_freshness_and_scope_are_blended_into_the_score():
    low = Capsule("low", "note", "pytest", confidence=0.2)
    stale = Capsule("stale", "note", "pytest", freshness=0.5)
    narrow = Capsule("narrow", "note", "pytest", scope_weight=0.5)
    full = Capsule("full", "note", "pytest")
    request = ContextRequest("pytest", 1000)
    one = {c.id: scores(request, [c]) for c in (low, stale, narrow, full)}
    assert one["full"] > one["low"] and one["full"] > one["stale"] and one["full"] > one["narrow"]


def test_kinds_filter_before_scoring_and_capping():
    request = ContextRequest("run the tests with pytest", 1000, kinds=["failure_pattern"], max_capsules=1)
    bundle = select_capsules(request, [PYTEST, FAILURE])
    assert ids(bundle) == ["flaky"] and bundle.excluded == []


def test_empty_kinds_keep_all_kinds():
    assert len(select_capsules(ContextRequest("x", 1000), [PYTEST, FAILURE]).capsules) == 2


def test_a_tag_in_the_text_or_kind_boosts_by_1_4_case_insensitively():
    plain = ContextRequest("tests", 1000)
    assert scores(ContextRequest("tests", 1000, tags=["PYTEST"]), [PYTEST]) == TAG_BOOST * scores(plain, [PYTEST])
    in_kind = ContextRequest("tests", 1000, tags=["Convention"])
    assert scores(in_kind, [PYTEST]) == TAG_BOOST * scores(plain, [PYTEST])
    assert scores(ContextRequest("tests", 1000, tags=["golang"]), [PYTEST]) == scores(plain, [PYTEST])


def test_a_tag_matching_one_of_the_capsules_own_tags_boosts_too():
    tagged = Capsule("t", "note", "use the runner", tags=["pytest"])
    plain = ContextRequest("runner", 1000)
    assert scores(ContextRequest("runner", 1000, tags=["pytest"]), [tagged]) == TAG_BOOST * scores(plain, [tagged])


def test_prefer_roles_boosts_by_1_3_after_the_tag_boost():
    plain = ContextRequest("tests", 1000)
    both = ContextRequest("tests", 1000, tags=["pytest"], prefer_roles=["convention"])
    assert scores(both, [PYTEST]) == TAG_BOOST * ROLE_BOOST * scores(plain, [PYTEST])
    assert scores(ContextRequest("tests", 1000, prefer_roles=["command"]), [PYTEST]) == scores(plain, [PYTEST])


def test_min_score_above_the_top_score_skips_everything_with_zero_tokens():
    request = ContextRequest("kubernetes helm chart", 1000, min_score=0.9)
    bundle = select_capsules(request, [PYTEST, BLACK])
    assert bundle.skipped and bundle.capsules == [] and bundle.used_tokens == 0
    assert 0 < bundle.top_score < 0.9 and sorted(bundle.excluded) == ["format", "tests"]


def test_zero_min_score_disables_the_check():
    bundle = select_capsules(ContextRequest("kubernetes", 1000), [PYTEST])
    assert not bundle.skipped and ids(bundle) == ["tests"]


def test_capsules_below_min_score_are_excluded_when_the_top_passes():
    request = ContextRequest("pytest tests committing", 1000, min_score=0.5)
    bundle = select_capsules(request, [PYTEST, BLACK])
    assert ids(bundle) == ["tests"] and bundle.excluded == ["format"] and not bundle.skipped


def test_greedy_fill_stays_within_budget_tokens():
    budget = COUNTER.count_text(PYTEST.text) + COUNTER.count_text(FAILURE.text)
    bundle = select_capsules(ContextRequest("tests pytest flaky", budget), [PYTEST, BLACK, FAILURE])
    assert ids(bundle) == ["tests", "flaky"] and bundle.excluded == ["format"]
    assert bundle.used_tokens == budget


def test_a_capsule_too_big_for_the_rest_of_the_budget_is_passed_over_for_a_smaller_one():
    big = Capsule("big", "note", "pytest " * 200)
    small = Capsule("small", "note", "pytest tip")
    bundle = select_capsules(ContextRequest("pytest", 50), [big, small])
    assert ids(bundle) == ["small"] and bundle.excluded == ["big"]


def test_max_capsules_caps_regardless_of_budget():
    request = ContextRequest("tests", 10_000, max_capsules=2)
    bundle = select_capsules(request, [PYTEST, BLACK, FAILURE])
    assert len(bundle.capsules) == 2 and len(bundle.excluded) == 1


def test_zero_max_capsules_means_no_cap():
    assert len(select_capsules(ContextRequest("tests", 10_000), [PYTEST, BLACK, FAILURE]).capsules) == 3


def test_ties_are_broken_by_id():
    twins = [Capsule(i, "note", "same text") for i in ("b", "c", "a")]
    assert ids(select_capsules(ContextRequest("same", 1000), twins)) == ["a", "b", "c"]


def test_no_capsules_gives_an_empty_bundle():
    assert select_capsules(ContextRequest("anything", 100), []) == ContextBundle()


def test_stage_is_carried_but_not_scored():
    assert scores(ContextRequest("tests", 1000, stage="plan"), [PYTEST]) == scores(
        ContextRequest("tests", 1000), [PYTEST]
    )


words = st.sampled_from(["pytest", "tests", "black", "format", "flaky", "network", "run", "lint"])
capsule_lists = st.lists(
    st.builds(
        Capsule,
        id=st.text("abcdef", min_size=1, max_size=3),
        kind=st.sampled_from(["convention", "command", "failure_pattern"]),
        text=st.lists(words, max_size=30).map(" ".join),
        confidence=st.floats(0, 1),
    ),
    max_size=8,
    unique_by=lambda c: c.id,
)


@given(capsule_lists, st.lists(words, max_size=5).map(" ".join), st.integers(0, 80), st.integers(0, 3))
def test_the_bundle_respects_budget_and_cap_and_accounts_for_every_candidate(capsules, query, budget, cap):
    bundle = select_capsules(ContextRequest(query, budget, max_capsules=cap), capsules)
    assert bundle.used_tokens == sum(COUNTER.count_text(c.text) for c in bundle.capsules) <= budget
    assert not cap or len(bundle.capsules) <= cap
    assert sorted(ids(bundle) + bundle.excluded) == sorted(c.id for c in capsules)
    assert select_capsules(ContextRequest(query, budget, max_capsules=cap), list(reversed(capsules))) == bundle
