"""How far back the agent reaches: what its message used from tool outputs, and how much only older outputs held."""

from __future__ import annotations

from typing import Any

from proxy.context.reach import MIN_EVIDENCE, MIN_SESSIONS, TRUST_SHARE, Reach, reach_of
from proxy.context.recall import message_tokens


def conversation(answer: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are an agent. Use run_tests_now when done."},
        {"role": "user", "content": "Fix parse_header_v2 in core_module.py."},
        {"role": "assistant", "content": "Reading setup_config.py first."},
        {"role": "tool", "tool_call_id": "a", "content": "old_helper_fn at line 4242\nsetup_config.py ok"},
        {"role": "assistant", "content": "Now the parser."},
        {"role": "tool", "tool_call_id": "b", "content": "new_parser_fn at line 1717"},
        {"role": "assistant", "content": answer},
    ]


def reach(answer: str) -> tuple[int, int]:
    messages = conversation(answer)
    outputs = [m["role"] == "tool" for m in messages]
    return reach_of(messages, len(messages) - 1, outputs, message_tokens(messages[-1]))


def test_a_name_from_the_newest_output_is_evidence_that_did_not_reach_back() -> None:
    assert reach("Editing new_parser_fn near 1717.") == (2, 0)


def test_a_name_only_an_older_output_held_reached_back() -> None:
    assert reach("Calling old_helper_fn from new_parser_fn.") == (2, 1)


def test_what_the_task_the_system_or_the_agent_itself_wrote_is_not_reaching_back() -> None:
    assert reach("parse_header_v2 and run_tests_now, as in setup_config.py.") == (2, 0)  # and its part `setup_config`
    assert reach("A brand_new_name nobody saw.") == (0, 0)


def test_a_name_inside_a_longer_one_is_not_the_same_name() -> None:
    assert reach("Editing parser_fn.") == (0, 0)


def test_the_history_trusts_an_agent_only_on_enough_sessions_that_rarely_reached_back() -> None:
    assert not Reach().trusts_newest() and Reach().share is None
    assert Reach(sessions=MIN_SESSIONS, evidence=MIN_EVIDENCE, older=0).trusts_newest()
    assert not Reach(sessions=MIN_SESSIONS - 1, evidence=10 * MIN_EVIDENCE, older=0).trusts_newest()
    assert not Reach(sessions=MIN_SESSIONS, evidence=MIN_EVIDENCE - 1, older=0).trusts_newest()
    over = int(TRUST_SHARE * 1000) + 1
    assert not Reach(sessions=10, evidence=1000, older=over).trusts_newest()
