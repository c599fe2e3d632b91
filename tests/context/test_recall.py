"""Specific tokens: the names, paths and numbers an agent reads in an output and writes back."""

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.context.recall import message_tokens, outputs_in_use, specific_tokens


def test_specific_tokens_are_identifiers_paths_and_numbers_not_common_words():
    found = specific_tokens("Error in django/db/models/query.py line 42: QuerySet.filter() got 7 args; see the file")
    assert {"django/db/models/query.py", "query.py", "QuerySet.filter", "QuerySet", "42"} <= found
    assert not found & {"Error", "line", "the", "file", "7", "see", "got", "args", "filter", "models", "query"}


def test_an_assistant_message_contributes_its_text_and_its_call_arguments():
    message = {
        "role": "assistant",
        "content": "Look at parse_header.",
        "tool_calls": [{"id": "c", "function": {"name": "bash", "arguments": '{"command": "sed -n 412,430p a/b.py"}'}}],
    }
    assert {"parse_header", "412", "430", "a/b.py"} <= message_tokens(message)


def _call(command: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {"arguments": command}}]}


def test_an_output_is_in_use_when_a_later_message_quotes_what_only_it_holds():
    messages = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix parse_config."},
        _call("grep -rn read_header src"),
        {"role": "tool", "content": "src/io_utils.py:88: def read_header(stream_obj):"},  # 3
        _call("cat setup.cfg"),
        {"role": "tool", "content": "[metadata] name = demo_pkg"},  # 5
        _call("grep -n parse_config src/config_loader.py"),
        {"role": "tool", "content": "src/config_loader.py:12: def parse_config(path):"},  # 7
        {"role": "assistant", "content": "The bug is in read_header at src/io_utils.py:88; parse_config is fine."},
        {"role": "tool", "content": "ok"},  # 9
    ]
    # 3 is quoted after it arrived; 5 never; 7 only for parse_config, which the task names; 9 has no quote after it.
    assert outputs_in_use(messages, [3, 5, 7, 9], recent=6) == {3}
    assert outputs_in_use(messages, [3, 5, 7, 9], recent=0) == set()


def test_a_quoted_token_counts_for_the_newest_output_that_holds_it():
    messages = [
        {"role": "user", "content": "Fix it."},
        _call("grep -rn HTTPAdapter ."),
        {"role": "tool", "content": "requests/adapters.py:54: class HTTPAdapter"},  # 2
        _call("python show_source.py"),
        {"role": "tool", "content": "54 class HTTPAdapter(BaseAdapter):"},  # 4
        {"role": "assistant", "content": "HTTPAdapter subclasses BaseAdapter."},
    ]
    assert outputs_in_use(messages, [2, 4], recent=6) == {4}


def test_kept_token_sets_are_the_tokens_themselves_and_stay_within_their_bytes() -> None:
    """`TokenSets` keeps the specific tokens of long texts so a warm turn does not tokenize a session's outputs
    again: what it gives back is what tokenizing gives, it holds at most its bytes, and `fit` shrinks it."""
    from proxy.context.recall import MEMO_MIN_CHARS, TokenSets, _specific_tokens

    sets = TokenSets(max_bytes=64 * 1024)
    texts = [f"File src/mod_{k}/handler.py, line {k + 10}, in run_{k}\n" * 40 for k in range(200)]
    assert all(len(text) >= MEMO_MIN_CHARS for text in texts)
    first = sets.of(texts[0])
    for text in texts + texts[-5:]:
        assert sets.of(text) == _specific_tokens(text)
        assert 0 < sets.held <= sets.max_bytes
    assert sets.of(texts[-1]) is sets.of(texts[-1])  # kept: the same set, not made again
    again = sets.of(texts[0])
    assert again == first and again is not first  # dropped for the newer ones, made again the same
    sets.fit(8 * 1024)
    assert 0 < sets.held <= 8 * 1024
    short = "see foo_bar.py"
    assert sets.of(short) == _specific_tokens(short)  # short texts are tokenized each time, never kept
    assert sets.held <= 8 * 1024


PIECES = [*"ab_Z09./- \n\t:é日\x1c(", "foo_bar", "x.py", "1234", "self", "QuerySet", "sed -n 430p"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40).map("".join))
def test_specific_tokens_split_by_bytes_and_remembered_are_the_regex_definition(text: str) -> None:
    """An ASCII text is split by a byte table and each chunk's tokens are remembered: the same tokens as the
    definition (every `[\\w./-]+` match worked out afresh), for ASCII and other texts, known chunks or new."""
    from proxy.context import recall

    def defined(text: str) -> frozenset[str]:
        return frozenset().union(*(recall._chunk_tokens(chunk) for chunk in re.findall(r"[\w./-]+", text)))

    assert recall._specific_tokens(text) == defined(text)
    assert recall._specific_tokens(text) == defined(text)  # its chunks now known


def test_the_chunk_memo_stays_within_its_bound() -> None:
    from proxy.context import recall

    recall._CHUNKS.clear()
    for k in range(recall.CHUNK_MEMO_ENTRIES + 10):
        recall._specific_tokens(f"name_{k} " + "x" * (recall.CHUNK_MEMO_MAX_CHARS + 1))
        assert len(recall._CHUNKS) <= recall.CHUNK_MEMO_ENTRIES  # the long chunk is never kept
    assert recall._specific_tokens("name_3 name_4") == {"name_3", "name_4"}
