"""A warm turn takes its edited messages' contents from the last turn (`journal.EditedContents`) and from its own
earlier renders instead of emitting them again, and compacts its newest output against the index of where the
earlier outputs' lines stand that the last turn left (`compact.StandingIndex`): what it sends, journals and reports
must be what the same turn makes with every edited message emitted by its step each time (`_emit_anew`, the render
before the contents were kept) and every earlier output indexed again (`_places_anew`), on a journal without last
turn's contents."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from proxy.context.compact import Places
from proxy.context.draft import Draft
from proxy.context.journal import KEEP, Journal
from proxy.context.messages import Message
from proxy.context.pipeline import process
from proxy.context.policy import ClearPolicy, Policy
from proxy.context.steps.compact import Compaction
from proxy.demo.traces import list_traces, load_trace
from proxy.tokens.counter import counter_for
from tests.context.replay import model, policy_for, turns

COUNTER = counter_for("o200k_base")
POLICY = Policy(clear_tool_outputs=ClearPolicy(keep_tokens=1500, clear_at_least=300))


def _steps(n: int, lines: int = 40) -> list[dict]:
    """An agent reading seven files in turn: outputs repeated whole (deduplicated), repeated but for a line
    (compacted) and old ones cleared as the conversation grows past a 16k window's budget."""
    messages: list[dict] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix it."}]
    for k in range(n):
        arguments = f'{{"cmd": "cat file_{k % 7}.py"}}'
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": arguments}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        body = "\n".join(f"def handler_{k % 7}_{j}(value): return value * {j} + {k % 7}" for j in range(lines))
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": body + ("\nok" if k % 5 == 4 else "")})
    return messages


def _emit_anew(draft: Draft, i: int) -> Message | None:
    """`Draft.emitted` as it was before contents were kept: the decision's step emits the message every time."""
    decision = draft.journal.decisions[i]
    return draft.messages[i] if decision.kind == KEEP else draft.emitters[decision.kind](draft, i, decision)


def _places_anew(compaction: Compaction, draft: Draft, i: int) -> Places:
    """`Compaction._standing_before` as it was before the index was kept: every output before `i` indexed again."""
    places = Places(set(draft.messages[i]["content"].split("\n")))
    for j in range(i):
        if (text := compaction.standing(draft, j)) is not None:
            places.add(j, text)
    return places


def _lockstep(
    monkeypatch: pytest.MonkeyPatch,
    requests: list[list[dict]],
    tools: object,
    policy: Policy,
    window: int,
    discount: float,
) -> int:
    """Each turn both ways, on the journal each way left; returns on how many turns last turn's contents held, and
    on how many last turn's index of standing lines was extended rather than made anew."""
    info = model(window, discount)
    kept, anew, held, extended = Journal(), Journal(), 0, 0
    for k, request in enumerate(requests):
        index = kept.standing
        upto = index.upto if index is not None else 0
        fast = process(kept, request, tools=tools, policy=policy, model=info, counter=COUNTER)
        extended += index is not None and fast.journal.standing is index and index.upto > upto
        with monkeypatch.context() as patch:
            patch.setattr(Draft, "emitted", _emit_anew)
            patch.setattr(Compaction, "_standing_before", _places_anew)
            full = process(anew, request, tools=tools, policy=policy, model=info, counter=COUNTER)
        assert orjson.dumps(fast.messages) == orjson.dumps(full.messages), f"turn {k + 1}: sent differently"
        assert fast.sources == full.sources, f"turn {k + 1}"
        assert fast.report.to_dict() == full.report.to_dict(), f"turn {k + 1}: reported differently"
        assert fast.journal.to_dict() == full.journal.to_dict(), f"turn {k + 1}: journaled differently"
        assert (fast.overflow is None) == (full.overflow is None), f"turn {k + 1}"
        if kept.edited is not None and kept.edited.reusable(fast.journal):
            held += 1
        kept, anew = fast.journal, full.journal
    return held, extended


@pytest.mark.parametrize("name", list_traces())
@pytest.mark.parametrize("window", [32000, 16000])
def test_a_trace_sends_the_same_bytes_with_last_turns_contents_as_with_every_content_emitted_anew(
    monkeypatch: pytest.MonkeyPatch, name: str, window: int
) -> None:
    trace = load_trace(name)
    policy = policy_for(trace, clear_tool_outputs=ClearPolicy(keep_tokens=2000, clear_at_least=500))
    held, extended = _lockstep(monkeypatch, list(turns(trace)), trace.tools, policy, window, 0.1)

    assert held > 0  # edits were made and their contents taken again on later turns
    assert extended > 0  # and the index of standing lines kept from turn to turn


def test_cleared_compacted_and_deduplicated_outputs_send_the_same_bytes_each_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    messages = _steps(40)

    held, _ = _lockstep(monkeypatch, [messages[:n] for n in range(3, len(messages) + 1, 2)], None, POLICY, 16000, 0.1)

    assert held > 10


def test_an_edited_history_sends_the_same_bytes_after_the_edit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client rewrites an early output and drops a step: last turn's contents hold only before the change."""
    messages = _steps(40)
    edited = [*messages[:7], {**messages[7], "content": "short now"}, *messages[10:]]  # step 2's output, step 3 gone
    requests = [messages[:n] for n in range(3, 61, 2)] + [edited[:n] for n in range(59, len(edited) + 1, 2)]

    held, _ = _lockstep(monkeypatch, requests, None, POLICY, 16000, 0.1)

    assert held > 10


def test_a_kept_content_is_taken_only_while_the_messages_it_was_made_from_lead_the_request() -> None:
    """A content planted in last turn's contents is what the next turn sends for that message (they are taken
    again, not emitted), until a message before it changes: then every content is emitted anew."""
    messages, info = _steps(31), model(16000, 0.1)
    journal = process(Journal(), messages[:-2], tools=None, policy=POLICY, model=info, counter=COUNTER).journal
    assert journal.edited is not None
    planted = journal.copy()
    contents = {i: (decision, f"planted {i}") for i, (decision, _) in journal.edited.contents.items()}
    planted.edited = replace(journal.edited, contents=contents)
    system = {"role": "system", "content": "You are an agent. Be brief."}

    grown = process(planted, messages, tools=None, policy=POLICY, model=info, counter=COUNTER)
    changed = process(planted, [system, *messages[1:]], tools=None, policy=POLICY, model=info, counter=COUNTER)

    assert journal.edited.reusable(grown.journal) == len(journal)
    assert all({**messages[i], "content": f"planted {i}"} in grown.messages for i in contents)
    assert journal.edited.reusable(changed.journal) == 0
    assert "planted" not in orjson.dumps(changed.messages).decode()
