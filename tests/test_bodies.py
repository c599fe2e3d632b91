"""proxy.service.body_memos: a warm turn's body parsed from what is new, always equal to the full parse."""

from __future__ import annotations

import json
import os

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.context.messages import message_digest
from proxy.demo.traces import load_trace, requests
from proxy.demo.traces_messages import messages_requests
from proxy.demo.traces_responses import responses_requests
from proxy.dialects import MESSAGES, RESPONSES
from proxy.dialects.base import kept_json
from proxy.dialects.body_checks import InvalidRequest, parse_chat_body
from proxy.service import body_memos as bodies_module
from proxy.service.body_memos import (
    CHAT_READING,
    MESSAGES_READING,
    PER_SCOPE,
    RESPONSES_READING,
    BodyMemos,
    array_end,
    messages_start,
)

TRACE = load_trace("sweagent_marshmallow-1867.json")
MB = 1024 * 1024


def sdk_json(body: dict) -> bytes:
    """As the official Python SDK sends it: json.dumps with its default separators and ASCII escapes."""
    return json.dumps(body).encode()


FORMATS = {
    "sdk": sdk_json,
    "orjson": orjson.dumps,
    "indented, messages last": lambda b: json.dumps(dict(reversed(list(b.items()))), indent=2).encode(),
    "unicode kept": lambda b: json.dumps(b, ensure_ascii=False, separators=(",", ":")).encode(),
}


def bodies(fmt=sdk_json, model="gpt-4o"):
    for messages, _ in requests(TRACE):
        yield fmt({"messages": messages, "model": model, "tools": TRACE.tools, "stream": True})


def assert_same_as_full_parse(parsed, raw):
    assert parsed.body == parse_chat_body(raw)
    assert parsed.digests == [message_digest(m) for m in parsed.body["messages"]]


@pytest.mark.parametrize("name", FORMATS)
def test_each_turn_of_a_trace_reuses_the_last_and_equals_the_full_parse(name):
    memos = BodyMemos(64 * MB)
    reused = []
    for raw in bodies(FORMATS[name]):
        parsed = memos.parse(raw, "key\x00\x00")
        assert_same_as_full_parse(parsed, raw)
        reused.append(parsed.reused)
    assert reused[0] == 0
    assert all(r > 0 for r in reused[1:]), reused  # every later turn repeats its predecessor


def test_an_edited_history_reuses_the_messages_before_the_edit_and_is_then_remembered_again():
    memos = BodyMemos(64 * MB)
    turns = [json.loads(raw) for raw in bodies()]
    memos.parse(sdk_json(turns[3]), "s")
    edited = json.loads(json.dumps(turns[4]))
    edited["messages"][1]["content"] = "an edited task"
    parsed = memos.parse(sdk_json(edited), "s")
    assert parsed.reused == 1  # the system prompt leads the edit byte for byte
    assert_same_as_full_parse(parsed, sdk_json(edited))
    edited["messages"][0]["content"] = "an edited system prompt"
    parsed = memos.parse(sdk_json(edited), "s")
    assert parsed.reused == 0
    assert_same_as_full_parse(parsed, sdk_json(edited))
    grown = {**edited, "messages": edited["messages"] + turns[5]["messages"][len(edited["messages"]) :]}
    parsed = memos.parse(sdk_json(grown), "s")
    assert parsed.reused == len(edited["messages"])
    assert_same_as_full_parse(parsed, sdk_json(grown))


def test_the_other_fields_are_read_anew_when_their_bytes_change_and_kept_while_they_do_not():
    """A warm body whose bytes besides the new messages are the last body's keeps its parsed fields (and notes)."""
    memos = BodyMemos(64 * MB)
    turns = [messages for messages, _ in requests(TRACE)][:6]
    tools = [TRACE.tools, TRACE.tools, TRACE.tools[:1], TRACE.tools[:1], TRACE.tools[:1], TRACE.tools]
    wide = [False, False, False, True, True, False]  # a field holding an integer past 64 bits, parsed exactly
    kept = [None, True, False, False, True, False]
    full = [True, False, False, True, False, False]  # a new field past 64 bits takes the full parse
    previous = None
    for messages, tools_now, big, keeps, parsed_in_full in zip(turns, tools, wide, kept, full, strict=True):
        body = {"model": "gpt-4o", "messages": messages, "tools": tools_now, "stream": True}
        raw = sdk_json({**body, "seed": "BIG"} if big else body).replace(b'"BIG"', b"%d" % 2**64)
        parsed = memos.parse(raw, "s")
        assert orjson.dumps(parsed.body) == orjson.dumps(parse_chat_body(raw))  # what goes upstream
        assert parsed.digests == [message_digest(m) for m in parsed.body["messages"]]
        assert parsed.reused == (0 if parsed_in_full else len(previous.body["messages"]))
        if previous is not None:
            assert (parsed.notes is previous.notes) is keeps
            assert (parsed.body["tools"] is previous.body["tools"]) is keeps
        previous = parsed


def test_a_memo_serves_only_its_own_scope():
    memos = BodyMemos(64 * MB)
    first, second = list(bodies())[:2]
    memos.parse(first, "key-a\x00\x00")
    assert memos.parse(second, "key-b\x00\x00").reused == 0
    assert memos.parse(second, "key-a\x00\x00").reused > 0


def test_a_repeated_messages_key_is_read_as_the_parser_reads_it():
    """orjson keeps the last of two `messages` keys; so must the shortcut, in both orders."""
    base = '{"messages": [{"role": "user", "content": "A"}], "model": "m", '
    base += '"messages": [{"role": "user", "content": "B"}]'
    memos = BodyMemos(64 * MB)
    for tail in ("}", ', "n": 1}'):
        raw = (base + tail).encode()
        assert memos.parse(raw, "s").body == parse_chat_body(raw)
    grown = base.replace('"B"}]', '"B"}, {"role": "assistant", "content": "C"}]') + "}"
    assert memos.parse(grown.encode(), "s").body["messages"][0]["content"] == "B"


def test_keys_and_brackets_inside_strings_are_not_structure():
    tricky = 'x"], "messages": [{"role": "user"}], "y": ["\\\\'
    messages = [{"role": "system", "content": tricky}, {"role": "user", "content": "{[}]"}]
    memos = BodyMemos(64 * MB)
    raw = sdk_json({"model": "m", "note": '"messages": [', "messages": messages})
    assert memos.parse(raw, "s").body == parse_chat_body(raw)
    grown = sdk_json({"model": "m", "note": '"messages": [', "messages": [*messages, {"role": "user", "content": "]"}]})
    parsed = memos.parse(grown, "s")
    assert parsed.reused == 2
    assert_same_as_full_parse(parsed, grown)


def test_a_bad_new_message_is_refused_with_its_index_in_the_whole_conversation():
    memos = BodyMemos(64 * MB)
    turns = [json.loads(raw) for raw in bodies()]
    memos.parse(sdk_json(turns[2]), "s")
    bad = {**turns[2], "messages": [*turns[2]["messages"], {"content": "no role"}]}
    with pytest.raises(InvalidRequest) as caught:
        memos.parse(sdk_json(bad), "s")
    assert caught.value.param == f"messages[{len(turns[2]['messages'])}].role"


@pytest.mark.parametrize("tail", [b"", b"]", b', {"role": "user", "content": "x"', b"], oops}"])
def test_a_broken_tail_gets_exactly_the_full_parses_error(tail):
    memos = BodyMemos(64 * MB)
    raw = sdk_json({"messages": [{"role": "user", "content": "hi"}], "model": "m"})
    memos.parse(raw, "s")
    broken = raw[: raw.index(b"}]") + 1] + tail
    with pytest.raises(InvalidRequest) as shortcut:
        memos.parse(broken, "s")
    with pytest.raises(InvalidRequest) as full:
        parse_chat_body(broken)
    assert shortcut.value.message == full.value.message


def test_memory_stays_within_the_budget_and_the_per_scope_cap():
    raws = list(bodies())
    memos = BodyMemos(3 * len(raws[-1]))  # room for one memo of the longest body
    for raw in raws:
        memos.parse(raw, "s")
        assert memos.held <= memos.budget and len(memos) <= 1
    many = BodyMemos(64 * MB)
    for k in range(PER_SCOPE + 5):
        many.parse(sdk_json({"messages": [{"role": "user", "content": f"task {k}"}], "model": "m"}), "s")
    assert len(many) == PER_SCOPE
    off = BodyMemos(0)
    for raw in raws[:3]:
        assert off.parse(raw, "s").reused == 0
    assert len(off) == 0


@pytest.fixture
def scans(monkeypatch) -> list[int]:
    """One entry per memo the store tried to make from a full parse (each costs a scan of the body)."""
    made: list[int] = []
    real = bodies_module._remembered
    monkeypatch.setattr(bodies_module, "_remembered", lambda *args: made.append(1) or real(*args))
    return made


def test_a_history_edited_every_turn_reuses_what_leads_the_edit_without_scanning_again(scans):
    memos = BodyMemos(64 * MB)
    system = {"role": "system", "content": "sys"}
    task = {"role": "user", "content": "the task"}
    for turn in range(8):  # the agent rewrites its third message (say, a clock) every turn
        clock = {"role": "user", "content": f"it is {turn} o'clock"}
        raw = sdk_json({"messages": [system, task, clock], "model": "m"})
        parsed = memos.parse(raw, "s")
        assert parsed.reused == (2 if turn else 0)
        assert_same_as_full_parse(parsed, raw)
        assert len(memos) == 1  # one memo per conversation: the newer body replaces the older
    assert len(scans) == 1  # only the first body was scanned whole
    other = sdk_json({"messages": [system, {"role": "user", "content": "another task"}], "model": "m"})
    assert memos.parse(other, "s").reused == 1  # the system prompt, from the memo it leads
    assert memos.parse(other, "s").reused == 2
    assert len(memos) == 2  # another conversation: the one whose system prompt it reused keeps its memo


def test_a_client_that_writes_its_history_anew_every_turn_stops_costing_memos(scans):
    """The same messages in other bytes (here indented anew every turn) extend no memo: an edited history by its
    first two messages, so after a few full scans no more memos are made for it."""
    memos = BodyMemos(64 * MB)
    made = []
    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": "the task"}]
    for turn in range(8):
        history.append({"role": "assistant", "content": f"answer {turn}"})
        raw = json.dumps({"messages": history, "model": "m"}, indent=turn + 1).encode()
        before = len(scans)
        parsed = memos.parse(raw, "s")
        assert parsed.reused == 0
        assert_same_as_full_parse(parsed, raw)
        made.append(len(scans) > before)
    assert made[:3] == [True] * 3 and not any(made[4:])


def test_more_conversations_than_the_budget_holds_stop_costing_memos(scans):
    """Round robin over 6 conversations with room for 2: without a check, each memo is evicted before its next turn."""
    conversations = [[{"role": "user", "content": f"task {k} " + "x" * 2000}] for k in range(6)]
    memos = BodyMemos(2 * 3 * 2200)  # two memos of these ~2.1-2.6 KB bodies
    reused = 0
    for turn in range(12):
        for history in conversations:
            history.append({"role": "assistant", "content": f"answer {turn}"})
            reused += memos.parse(sdk_json({"messages": history, "model": "m"}), "s").reused > 0
    assert len(scans) < 72 / 4, len(scans)  # without the check: a scan on every one of the 72 turns, no hit
    assert reused > 0  # the memos kept serve their conversations instead of being pushed out unused


def test_the_scanner_finds_the_array_only_at_the_top_level():
    raw = b'{"meta": {"messages": [1]}, "messages" :\n [ {"a": "]"} , {"b": [1, {"c": "}"}]}\n ], "z": 0}'
    start = messages_start(raw)
    assert raw[start:].startswith(b'{"a"')
    end = array_end(raw, start)
    assert raw[start:end] == b'{"a": "]"} , {"b": [1, {"c": "}"}]}'


texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system"]), "content": texts},
    optional={
        "name": texts,
        "extra": st.lists(
            st.one_of(texts, st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False)),
            max_size=3,
        ),
    },
)


# HOSTILE_EXAMPLES=3000 for a longer hunt outside CI (as tests/test_hostile_inputs.py).
@settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    history=st.lists(message, min_size=1, max_size=6),
    growth=st.lists(st.lists(message, max_size=3), min_size=1, max_size=4),
    fmt=st.sampled_from(sorted(FORMATS)),
    edit_at=st.one_of(st.none(), st.integers(min_value=0, max_value=5)),
)
def test_property_any_growth_or_edit_parses_as_the_full_parse(history, growth, fmt, edit_at):
    memos = BodyMemos(64 * MB)
    messages = list(history)
    raw = FORMATS[fmt]({"messages": messages, "model": "m"})
    assert_same_as_full_parse(memos.parse(raw, "s"), raw)
    for step, added in enumerate(growth):
        messages = messages + added
        if edit_at is not None and step == 1 and edit_at < len(messages):
            messages[edit_at] = {**messages[edit_at], "content": "edited"}
        raw = FORMATS[fmt]({"messages": messages, "model": "m", "stream": False})
        assert_same_as_full_parse(memos.parse(raw, "s"), raw)


@pytest.mark.parametrize("marks", ["claude-code", "none"])
def test_messages_bodies_reuse_what_leads_their_moved_breakpoint_and_equal_the_full_parse(marks):
    """Claude Code marks its last message, so the previous last message changes every turn: the messages before
    it are reused, and each message's key is its exact JSON, as `MessagesDialect.conversation` compares them."""
    memos = BodyMemos(64 * MB)
    previous = 0
    for k, body in enumerate(messages_requests(TRACE, "claude-sonnet-4-5", marks)):
        raw = sdk_json(body)
        parsed = memos.parse(raw, "s", MESSAGES_READING)
        assert orjson.dumps(parsed.body) == orjson.dumps(MESSAGES.parse(raw))  # what goes upstream
        assert parsed.digests == [kept_json(m) for m in parsed.body["messages"]]
        assert parsed.reused == (0 if k == 0 else previous - 1 if marks == "claude-code" else previous), k
        previous = len(body["messages"])


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_responses_bodies_reuse_every_earlier_item_and_map_as_the_full_parse(name):
    """Codex sends its whole `input` every turn: each body reuses the last one's items, each item keyed by its exact
    JSON, from which the dialect joins each group's JSON instead of dumping the group again; and the conversation it
    continues lends it the groups of those items."""
    memos = BodyMemos(64 * MB)
    previous, last = 0, None
    for k, body in enumerate(responses_requests(load_trace("mini_django-11138.tools.json"), "gpt-5")):
        raw = FORMATS[name](body)
        parsed = memos.parse(raw, "s", RESPONSES_READING)
        full = RESPONSES.parse(raw)
        assert orjson.dumps(parsed.body) == orjson.dumps(full)  # what goes upstream
        # The groups of the conversation before whose items are these very objects are taken, not made again.
        continued = (parsed.body, parsed.digests, [last] if k else [])
        assert parsed.digests == [kept_json(item) for item in full["input"]]
        assert parsed.reused == (0 if k == 0 else previous), k
        anew = RESPONSES.conversation(full)
        for mapped in (RESPONSES.conversation(parsed.body, parsed.digests), RESPONSES.conversation(*continued)):
            assert mapped.groups == anew.groups and mapped.made_from == anew.made_from
            assert mapped.digests == anew.digests and mapped.messages == anew.messages
        previous, last = len(body["input"]), mapped


def test_a_bad_new_input_item_is_refused_as_the_full_parse_refuses_it():
    memos = BodyMemos(64 * MB)
    items = [{"type": "message", "role": "user", "content": "hi"}]
    memos.parse(sdk_json({"model": "m", "input": items}), "s", RESPONSES_READING)
    for bad, param in (([*items, 7], "input[1]"), ([*items, {"type": "message", "role": "robot"}], "input[1].role")):
        raw = sdk_json({"model": "m", "input": bad})
        with pytest.raises(InvalidRequest) as shortcut:
            memos.parse(raw, "s", RESPONSES_READING)
        with pytest.raises(InvalidRequest) as full:
            RESPONSES.parse(raw)
        assert (
            (shortcut.value.param, shortcut.value.message)
            == (full.value.param, full.value.message)
            == (
                param,
                full.value.message,
            )
        )
    raw = sdk_json({"model": "m", "input": [*items, items[0]], "instructions": 3})
    with pytest.raises(InvalidRequest) as caught:
        memos.parse(raw, "s", RESPONSES_READING)
    assert caught.value.param == "instructions"


element = st.one_of(message, message, message, texts, st.integers(-(2**63), 2**63 - 1), st.none())
READERS = {"chat": CHAT_READING, "messages": MESSAGES_READING, "responses": RESPONSES_READING}


def outcome(read, raw: bytes):
    """What reading `raw` gives: the body's bytes and its keys, or the client's error (its parameter and words)."""
    try:
        parsed = read(raw)
    except InvalidRequest as refused:
        return ("refused", refused.param, refused.message)
    return ("read", orjson.dumps(parsed.body), parsed.digests)


@settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    api=st.sampled_from(sorted(READERS)),
    history=st.lists(element, min_size=1, max_size=6),
    growth=st.lists(st.lists(element, max_size=3), min_size=1, max_size=4),
    fmt=st.sampled_from(sorted(FORMATS)),
    edit_at=st.one_of(st.none(), st.integers(min_value=0, max_value=5)),
    instructions=st.sampled_from([None, "be brief", 3]),
)
def test_property_every_api_reads_any_growth_or_edit_as_its_full_parse_does(
    api, history, growth, fmt, edit_at, instructions
):
    """Any history, grown or edited anywhere, with elements no API takes among them: the memo's body and keys, or
    its refusal, are the full parse's, for chat, Messages and Responses alike."""
    reading, memos = READERS[api], BodyMemos(64 * MB)
    field = reading.field
    items = list(history)
    for step in range(len(growth) + 1):
        if step:
            items = items + growth[step - 1]
            if edit_at is not None and step == 2 and edit_at < len(items):
                items[edit_at] = {"role": "user", "content": "edited"}
        body = {"model": "m", field: items}
        if instructions is not None and step % 2:
            body["instructions"] = instructions  # a field past the array that changes between turns
        raw = FORMATS[fmt](body)

        def full(raw):
            parsed = reading.parse(raw)
            return bodies_module.Parsed(parsed, [reading.key(m) for m in parsed[field]])

        assert outcome(lambda raw: memos.parse(raw, "s", reading), raw) == outcome(full, raw)


def test_a_responses_group_is_taken_from_the_conversation_before_only_where_the_item_after_it_is_the_same():
    """A group ends where the item after it says (an assistant message takes the calls right after it): an edited
    history whose item after a group is now a call groups that message anew, with the call."""
    user = {"type": "message", "role": "user", "content": "fix the test"}
    said = {"type": "message", "role": "assistant", "content": "looking"}
    again = {"type": "message", "role": "user", "content": "go on"}
    call = {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    before = RESPONSES.conversation({"model": "m", "input": [user, said, again, said]})
    for items in ([user, said, call, output], [user, said, again, said, again]):
        body = {"model": "m", "input": items}
        continued, anew = RESPONSES.conversation(body, None, [before]), RESPONSES.conversation(body)
        assert continued.groups == anew.groups and continued.made_from == anew.made_from
        assert continued.messages == anew.messages and continued.digests == anew.digests
    assert RESPONSES.conversation(body, None, [before]).groups[1] is before.groups[1]  # [said], `again` after it


def test_a_conversation_that_borrows_another_ones_leading_messages_leaves_that_ones_memo_in_place():
    """Two conversations of one scope open with the same system prompt. A new one reuses the other's first message,
    and the other's next body still extends its own memo: the borrowed memo is not taken away from it."""
    memos = BodyMemos(64 * MB)
    system = {"role": "system", "content": "you are an agent " * 50}
    one = [system, {"role": "user", "content": "task one"}, {"role": "assistant", "content": "on it"}]
    memos.parse(sdk_json({"messages": one, "model": "m"}), "s")
    other = [system, {"role": "user", "content": "task two"}]
    assert memos.parse(sdk_json({"messages": other, "model": "m"}), "s").reused == 1
    grown = [*one, {"role": "user", "content": "go on"}]
    assert memos.parse(sdk_json({"messages": grown, "model": "m"}), "s").reused == len(one)
    assert memos.parse(sdk_json({"messages": [*other, one[2]], "model": "m"}), "s").reused == len(other)
    assert len(memos) == 2
