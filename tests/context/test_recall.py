"""Specific tokens: the names, paths and numbers an agent reads in an output and writes back."""

from proxy.context.recall import message_tokens, quoted_outputs, specific_tokens


def test_specific_tokens_are_identifiers_paths_and_numbers_not_common_words():
    found = specific_tokens("Error in django/db/models/query.py line 42: QuerySet.filter() got 7 args; see the file")
    assert {"django/db/models/query.py", "query", "models", "QuerySet.filter", "QuerySet", "filter", "42"} <= found
    assert not found & {"Error", "line", "the", "file", "7", "see", "got", "args"}


def test_an_assistant_message_contributes_its_text_and_its_call_arguments():
    message = {
        "role": "assistant",
        "content": "Look at parse_header.",
        "tool_calls": [{"id": "c", "function": {"name": "bash", "arguments": '{"command": "sed -n 412,430p a/b.py"}'}}],
    }
    assert {"parse_header", "412", "430", "a/b.py"} <= message_tokens(message)


def test_a_quoted_output_is_the_newest_that_holds_the_quoted_token():
    outputs = [frozenset({"alpha_one"}), frozenset({"alpha_one", "beta_two"}), frozenset({"gamma"})]
    assert quoted_outputs(outputs, [frozenset({"alpha_one"})]) == [False, True, False]
