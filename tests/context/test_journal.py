"""The journal: compact, JSON-safe, and replaying identically after a round trip."""

import orjson

from proxy.context import ClearPolicy, HeuristicCounter, ModelInfo, Policy
from proxy.context.journal import CLEARED, Decision, Journal
from proxy.context.pipeline import process
from tests.context.replay import agent

COUNTER = HeuristicCounter()
POLICY = Policy(clear_tool_outputs=ClearPolicy(keep_tokens=1000, keep_under=100, clear_at_least=500))
NO_CACHE = ModelInfo(context_window=128000, input_per_mtok=1.0, cached_input_per_mtok=1.0)


def journal_after(messages):
    journal = Journal()
    for i in range(2, len(messages) + 1, 2):
        journal = process(journal, messages[:i], tools=None, policy=POLICY, model=NO_CACHE, counter=COUNTER).journal
    return journal


def test_to_dict_from_dict_round_trip_replays_identically():
    messages = agent(30)
    journal = journal_after(messages)
    assert any(d.kind == CLEARED for d in journal.decisions)
    restored = Journal.from_dict(orjson.loads(orjson.dumps(journal.to_dict())))
    assert restored.to_dict() == journal.to_dict()
    longer = agent(31)
    a = process(journal, longer, tools=None, policy=POLICY, model=NO_CACHE, counter=COUNTER)
    b = process(restored, longer, tools=None, policy=POLICY, model=NO_CACHE, counter=COUNTER)
    assert orjson.dumps(a.messages) == orjson.dumps(b.messages)


def test_the_journal_stores_no_message_bodies():
    messages = agent(20, output_tokens=2000)
    stored = orjson.dumps(journal_after(messages).to_dict())
    assert b"xxxxxxxx" not in stored
    assert len(stored) < 0.1 * len(orjson.dumps(messages))


def test_align_keeps_the_matching_prefix_and_drops_later_injections():
    journal = Journal()
    for k in range(5):
        journal.append(bytes([k]) * 16, 10, 10, False)
    assert journal.align([bytes([k]) * 16 for k in (0, 1, 9)]) == 2
    assert len(journal) == 2


def test_decisions_round_trip_through_json():
    for decision in (Decision(), Decision(CLEARED), Decision("cut", max_tokens=300), Decision("deduped", 0, "[x]", 3)):
        assert Decision.from_json(orjson.loads(orjson.dumps(decision.to_json()))) == decision


def test_copy_is_independent():
    journal = journal_after(agent(4))
    copy = journal.copy()
    copy.cut(1)
    assert len(journal) == len(agent(4)) and len(copy) == 1


def test_copy_carries_every_field():
    journal = journal_after(agent(4))
    journal.turn, journal.epochs, journal.unpaid_bound = 7, 2, 1500
    assert journal.copy() == journal  # a field added to Journal but not to copy() would differ here
