"""Which edits an epoch makes under a price model: the part of a clearing that pays most, dedup that rides
on it, and a session's edits never behind sending the client's requests as they were, but on an edit's own turn."""

from dataclasses import replace

import pytest

from bench.quality import held_out
from proxy.context.clearing import PLACEHOLDER
from proxy.context.economics import BEHIND, NEXT_TURN_BEHIND, bill, cached_prefix, within_budget
from proxy.context.journal import Journal
from proxy.context.pipeline import process
from proxy.context.policy import Policy
from proxy.context.survival import NO_HISTORY, Lifetimes
from tests.context.replay import TRACE_NAMES, _blocks, agent, load, model, policy_for, run, turns


def _thinking_agent(steps: int = 150) -> list[dict]:
    """A long synthetic run whose first three calls come with ~1000 tokens of reasoning each: clearing from
    its oldest output rewrites that reasoning too. Its second output repeats the first."""
    full = agent(steps, output_tokens=400)
    for i in (2, 4, 6):
        full[i] = {**full[i], "content": "I think about it. " * 200}
    full[5] = {**full[5], "content": full[3]["content"]}
    return full


def _first_epoch(discount: float, counter) -> tuple[list[dict], list[dict]]:
    """The thinking run replayed until its first clearing epoch: (what was sent, the client's messages).

    Its repeated output arrived as the last message, so it was sent in full.
    """
    full, journal = _thinking_agent(), Journal()
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
    assert cleared[0] > 5 and sent[: cleared[0]] == client[: cleared[0]]  # so the repeat at 5 is not deduplicated:
    # a clearing epoch deduplicates only where it rewrites anyway


def test_without_caching_the_first_epoch_clears_from_the_oldest_output(real_counter):
    sent, _ = _first_epoch(1.0, real_counter)
    assert sent[3]["content"] == PLACEHOLDER


def test_an_edit_that_costs_more_than_it_frees_stakes_half_of_what_was_banked_and_its_next_turns_saving():
    far = 1e9  # a direct bill so far that caps nothing
    assert within_budget(-50.0, banked=0.0, per_turn=0.0)  # frees more than it rewrites: always
    assert within_budget(90.0, banked=0.0, per_turn=100.0, direct=far)  # won back on the next turn
    assert not within_budget(110.0, banked=0.0, per_turn=100.0, direct=far)
    assert within_budget(1100.0, banked=2000.0, per_turn=100.0, direct=far)  # half the 2000 banked, the next turn
    assert not within_budget(1101.0, banked=2000.0, per_turn=100.0, direct=far)
    assert within_budget(1000.0, banked=2000.0, per_turn=0.0)  # within the stake: no cap, the session stays ahead
    assert not within_budget(110.0, banked=-5000.0, per_turn=100.0, direct=far)
    assert within_budget(100.0, -5000.0, 100.0, direct=far)
    assert within_budget(1100.0, banked=0.0, per_turn=100.0, first_turn=1000.0, risk_turns=1.0)  # a first edit's bet
    assert not within_budget(1100.0, banked=0.0, per_turn=100.0, first_turn=1000.0)  # ... when the policy allows it
    assert within_budget(-50.0, banked=0.0, per_turn=0.0, first_turn=0.0, risk_turns=float("inf"))  # not a first edit


def test_an_edit_won_back_on_the_next_turn_is_capped_by_the_sessions_direct_bill_so_far_too():
    """Were the session to end on the edit's turn, it would bill `cost - banked` above direct: at most
    `NEXT_TURN_BEHIND` of its direct bill so far (issue 27: no session above 1.02 of direct, with no history too),
    whatever the next turn would win."""
    assert NEXT_TURN_BEHIND == 0.02
    assert within_budget(90.0, banked=0.0, per_turn=100.0, direct=90.0 / NEXT_TURN_BEHIND)
    assert not within_budget(90.0, banked=0.0, per_turn=100.0, direct=89.0 / NEXT_TURN_BEHIND)
    assert not within_budget(90.0, banked=0.0, per_turn=100.0)  # no direct bill yet: no bet
    assert within_budget(90.0, banked=50.0, per_turn=100.0, direct=40.0 / NEXT_TURN_BEHIND)  # what was banked counts
    assert not within_budget(90.0, banked=0.0, per_turn=100.0, direct=89.0 / NEXT_TURN_BEHIND, behind=0.01)  # tighter


def test_a_bet_on_the_turns_the_history_assures_is_capped_by_the_sessions_direct_bill_so_far():
    assert not within_budget(500.0, banked=0.0, per_turn=100.0, assured_turns=5)  # no direct bill: no bet
    assert within_budget(500.0, banked=0.0, per_turn=100.0, assured_turns=5, direct=500.0 / BEHIND)
    assert not within_budget(500.0, banked=0.0, per_turn=100.0, assured_turns=4, direct=500.0 / BEHIND)  # not won back
    assert not within_budget(500.0, banked=0.0, per_turn=100.0, assured_turns=5, direct=400.0 / BEHIND)
    assert within_budget(500.0, banked=400.0, per_turn=100.0, assured_turns=5, direct=150.0 / BEHIND)  # banked counts


def test_with_a_history_edits_bet_on_it_and_no_session_falls_more_than_behind_direct(real_counter):
    """An agent with the lengths of these very runs as its history (what `bench fleet`'s tuned pass knows):
    costly clearings bet on the turns it assures and save more at d = 0.1 than with no history; whenever a
    session ends, by the engine's own counts its edits have cost it at most `bet_overrun` (`BEHIND` by
    default) of its direct bill so far (and a little more on the turn an epoch's estimate was short). A lower
    `bet_overrun` lets fewer bets through: less saved over the runs, less risked on each."""
    traces = [load(name) for name in [*TRACE_NAMES, *held_out("sample_a")]]
    long = Lifetimes.of([len(list(turns(trace))) for trace in traces])
    billed = {(NO_HISTORY, BEHIND): 0.0, (long, BEHIND): 0.0, (long, NEXT_TURN_BEHIND): 0.0}
    for trace in traces:
        name = trace.name
        for lifetimes, overrun in billed:
            journal, sent = Journal(), []
            for request in turns(trace):
                out = process(
                    journal, request, tools=trace.tools, policy=policy_for(trace, bet_overrun=overrun),
                    model=model(128000, 0.1), counter=real_counter, lifetimes=lifetimes,
                )  # fmt: skip
                journal = out.journal
                sent.append(_blocks(out.messages, trace.tools or [], real_counter))
                assert journal.banked >= -(overrun + 0.0025) * journal.direct, f"{name}: {journal.banked:.0f} banked"
            billed[lifetimes, overrun] += bill(sent, 0.1).billed
    ratios = (billed[long, BEHIND] / billed[NO_HISTORY, BEHIND], billed[long, BEHIND] / billed[long, NEXT_TURN_BEHIND])
    # 0.934, 0.946: the history's bets save, and a tighter cap holds them back
    assert ratios[0] < 0.95 and ratios[1] < 0.97, ratios


def _turn_bills(requests: list[list], counter, tools, discount: float) -> list[float]:
    blocks = [_blocks(r, tools or [], counter) for r in requests]
    bills, previous = [], []
    for request in blocks:
        hit = cached_prefix(previous, request)
        bills.append(sum(n for _, n in request) - hit + discount * hit)
        previous = request
    return bills


@pytest.mark.parametrize("discount", [0.5, 0.1])
def test_at_no_turn_but_an_edits_own_is_a_session_behind_direct(discount, real_counter):
    """However soon a session ends, its edits have not cost it more than sending its requests as they were,
    unless it ends on the turn of an edit, and then by less than that turn's input. Over every trace we
    have (packaged, held-out, the three samples, the other agents' runs): the 24 sampled runs are where the first
    edit's old one-turn allowance billed 3 traces above direct; fc_replace_marshmallow-1867 is where a clearing
    priced without the compacted output that pointed into what it cleared (and stood whole again) billed 1.106."""
    names = [*TRACE_NAMES, *held_out(), *held_out("sample_a"), *held_out("sample_b"), *held_out("sample_c")]
    names += [*held_out("others_a"), *held_out("others_b")]
    assert len(names) == 67
    for name in names:
        trace = load(name)
        result = run(trace, policy_for(trace), model(128000, discount), real_counter)
        direct = _turn_bills(list(turns(trace)), real_counter, trace.tools, discount)
        proxied = _turn_bills(result.requests, real_counter, trace.tools, discount)
        behind = 0.0
        for k, (d, p, outcome) in enumerate(zip(direct, proxied, result.outcomes, strict=True)):
            behind += p - d
            allowed = d if outcome.report.rewrote_prefix else 1e-6
            assert behind <= allowed, f"{name} turn {k}: {behind:.1f} billed tokens behind direct (turn: {d:.0f})"


def test_a_first_edit_that_may_risk_a_turns_input_saves_more_with_cheap_caching_and_may_end_above_direct(
    real_counter,
):
    """`first_edit_risk_turns = 1` lets the first costly edit bet one turn's input on the session going on:
    more savings at d = 0.1 on the packaged traces, and mini_django-15973, which ends 8 turns after its
    first edit, billed above direct (the default, 0, keeps it at direct)."""
    bills = {}
    for risk in (0.0, 1.0):
        for name in [*TRACE_NAMES, *held_out("sample_b")]:
            trace = load(name)
            result = run(trace, policy_for(trace, first_edit_risk_turns=risk), model(128000, 0.1), real_counter)
            bills[risk, str(name)] = (result.proxied.billed, result.direct.billed)
    packaged = {risk: sum(bills[risk, n][0] for n in TRACE_NAMES) for risk in (0.0, 1.0)}
    # 0.936 of the default's bill before compaction; 0.994 with it, which made the default 0.962 of direct, not 0.998
    assert packaged[1.0] < 0.995 * packaged[0.0]
    short = next(n for risk, n in bills if "django-15973" in n)
    assert bills[1.0, short][0] > bills[1.0, short][1] and bills[0.0, short][0] <= bills[0.0, short][1]


def _clearing_starts(info, counter) -> list[int]:
    """Where each clearing epoch of the thinking run starts clearing."""
    full, journal, starts = _thinking_agent(), Journal(), []
    for k in range(4, len(full) + 1, 2):
        out = process(journal, full[:k], tools=None, policy=Policy(), model=info, counter=counter)
        journal = out.journal
        if out.report.epoch and out.report.cleared:
            starts.append(min(i for i, m in enumerate(out.messages) if m.get("content") == PLACEHOLDER))
    return starts


def test_where_the_cache_is_read_only_at_its_marks_an_epoch_clears_from_the_oldest_long_output(real_counter):
    """Anthropic reads the prefix up to the proxy's mark before the oldest long output still sent, not up to
    any edit: clearing only newer outputs would rewrite as much and free less."""
    anywhere = replace(model(128000, 0.2), cache_write_per_mtok=1.25)
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
