"""Which edits an epoch makes under a price model: the part of a clearing that pays most, dedup that rides
on it, and a session's edits never more than a turn's bill behind sending the client's requests as they were."""

from dataclasses import replace

import pytest

from proxy.context.clearing import PLACEHOLDER
from proxy.context.economics import cached_prefix, within_budget
from proxy.context.journal import Journal
from proxy.context.pipeline import process
from proxy.context.policy import Policy
from tests.context.replay import TRACE_NAMES, _blocks, agent, load, model, policy_for, run, turns


def _first_epoch(discount: float, counter) -> tuple[list[dict], list[dict]]:
    """A long synthetic run replayed until its first clearing epoch: (what was sent, the client's messages).

    Its second output repeats the first; it arrived as the last message, so it was sent in full.
    """
    full, journal = agent(150, output_tokens=400), Journal()
    full[5] = {**full[5], "content": full[3]["content"]}
    for k in range(4, len(full) + 1, 2):
        out = process(journal, full[:k], tools=None, policy=Policy(), model=model(128000, discount), counter=counter)
        journal = out.journal
        if out.report.epoch:
            return out.messages, full[:k]
    raise AssertionError("no epoch")


def test_with_cheap_caching_the_first_epoch_clears_only_the_newer_outputs(real_counter):
    sent, client = _first_epoch(0.1, real_counter)
    cleared = [i for i, m in enumerate(sent) if m.get("content") == PLACEHOLDER]
    assert cleared, "the epoch cleared nothing"
    assert sent[3] == client[3]  # the oldest output: clearing from there would rewrite the whole prefix
    assert sent[: cleared[0]] == client[: cleared[0]]  # the repeat too: deduplicating it would rewrite as much


def test_a_clearing_epoch_deduplicates_only_where_it_rewrites_anyway(real_counter):
    full, journal = agent(150, output_tokens=400), Journal()
    full[5] = {**full[5], "content": full[3]["content"]}
    for k in range(4, len(full) + 1, 2):
        out = process(journal, full[:k], tools=None, policy=Policy(), model=model(128000, 0.1), counter=real_counter)
        journal = out.journal
        if out.report.epoch:
            break
    assert out.report.deduped == 0 and out.messages[5] == full[5]


def test_without_caching_the_first_epoch_clears_from_the_oldest_output(real_counter):
    sent, _ = _first_epoch(1.0, real_counter)
    assert sent[3]["content"] == PLACEHOLDER


def test_an_edit_that_costs_more_than_it_frees_spends_only_what_was_banked_and_one_turn():
    assert within_budget(-50.0, banked=0.0, turn=0.0)  # frees more than it rewrites: always
    assert within_budget(900.0, banked=0.0, turn=1000.0)
    assert not within_budget(1100.0, banked=0.0, turn=1000.0)
    assert within_budget(1100.0, banked=200.0, turn=1000.0)  # half the 200 banked, and the turn
    assert not within_budget(1101.0, banked=200.0, turn=1000.0)
    assert not within_budget(1100.0, banked=-5000.0, turn=1000.0) and within_budget(1000.0, -5000.0, 1000.0)


def test_after_a_sessions_first_edit_a_costly_edit_stakes_at_most_half_of_what_was_banked():
    assert within_budget(-50.0, banked=0.0, turn=1000.0, first=False)
    assert not within_budget(900.0, banked=0.0, turn=1000.0, first=False)
    assert within_budget(900.0, banked=1800.0, turn=1000.0, first=False)
    assert not within_budget(900.0, banked=1799.0, turn=1000.0, first=False)


def _turn_bills(requests: list[list], counter, tools, discount: float) -> list[float]:
    blocks = [_blocks(r, tools or [], counter) for r in requests]
    bills, previous = [], []
    for request in blocks:
        hit = cached_prefix(previous, request)
        bills.append(sum(n for _, n in request) - hit + discount * hit)
        previous = request
    return bills


@pytest.mark.parametrize("discount", [0.5, 0.1])
def test_at_no_turn_do_the_edits_leave_a_session_more_than_a_turn_behind_direct(discount, real_counter):
    """However soon a session ends, the proxy has not cost it more than about one turn's input."""
    for name in TRACE_NAMES:
        trace = load(name)
        result = run(trace, policy_for(trace), model(128000, discount), real_counter)
        direct = _turn_bills(list(turns(trace)), real_counter, trace.tools, discount)
        proxied = _turn_bills(result.requests, real_counter, trace.tools, discount)
        behind = 0.0
        for k, (d, p) in enumerate(zip(direct, proxied, strict=True)):
            behind += p - d
            assert behind <= 1.1 * d, f"{name} turn {k}: {behind:.0f} billed tokens behind direct, a turn is {d:.0f}"


def _clearing_starts(info, counter) -> list[int]:
    """Where each clearing epoch of a long synthetic run starts clearing."""
    full, journal, starts = agent(150, output_tokens=400), Journal(), []
    for k in range(4, len(full) + 1, 2):
        out = process(journal, full[:k], tools=None, policy=Policy(), model=info, counter=counter)
        journal = out.journal
        if out.report.epoch and out.report.cleared:
            starts.append(min(i for i, m in enumerate(out.messages) if m.get("content") == PLACEHOLDER))
    return starts


def test_where_the_cache_is_read_only_at_its_marks_an_epoch_clears_from_the_oldest_long_output(real_counter):
    """Anthropic reads the prefix up to the proxy's mark before the oldest long output still sent, not up to
    any edit: clearing only newer outputs would rewrite as much and free less."""
    anywhere = replace(model(128000, 0.1), cache_write_per_mtok=1.25)
    assert _clearing_starts(anywhere, real_counter)[0] > 3
    marked = _clearing_starts(replace(anywhere, marked_cache=True), real_counter)
    assert marked and set(marked) == {3}


def test_a_cold_cache_makes_the_clearing_a_warm_one_would_not_yet_pay_for(real_counter):
    """Past the cache's TTL the request is written in full whatever it holds: an edit re-bills nothing."""
    full, journal, info = agent(150, output_tokens=400), Journal(), model(128000, 0.1)
    for k in range(4, len(full) + 1, 2):
        warm = process(journal, full[:k], tools=None, policy=Policy(), model=info, counter=real_counter)
        if warm.report.epoch:
            break
        cold = process(
            journal, full[:k], tools=None, policy=Policy(), model=info, counter=real_counter, cache_cold=True
        )
        if cold.report.epoch:
            assert cold.report.reasons == ("clearing", "cache_cold") and cold.report.cleared > 0
            assert cold.report.banked > journal.banked  # it saved at once what it freed
            after = process(cold.journal, full[: k + 2], tools=None, policy=Policy(), model=info, counter=real_counter)
            assert not after.report.epoch and after.messages[: len(cold.messages)] == cold.messages
            return
        journal = warm.journal
    raise AssertionError("a warm epoch came first: the cold cache bought nothing")
