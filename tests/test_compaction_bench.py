"""`bench compaction`'s measure of what log folds could still remove (issue 27): templates and shared prefixes."""

from __future__ import annotations

from bench.compaction import _folds
from proxy.tokens.counter import counter_for

COUNTER = counter_for("o200k_base")


def test_a_log_line_that_repeats_a_template_higher_up_counts_whole() -> None:
    log = "collected 3 items\ntest_one.py::test_case_1 PASSED [ 33%]\ntest_one.py::test_case_2 PASSED [ 66%]"
    templates, _ = _folds(log, COUNTER)
    assert templates == COUNTER.count_text("test_one.py::test_case_2 PASSED [ 66%]")


def test_a_listing_counts_what_each_line_shares_with_the_one_before() -> None:
    listing = "./build/lib/requests/packages/urllib3/util/retry.py\n./build/lib/requests/packages/urllib3/util/ssl_.py"
    templates, prefixes = _folds(listing, COUNTER)
    assert templates == 0
    assert prefixes == COUNTER.count_text("./build/lib/requests/packages/urllib3/util/")


def test_short_lines_and_short_prefixes_count_nothing() -> None:
    assert _folds("ok\nok\nok 2\nok 3\nsrc/a.py\nsrc/b.py", COUNTER) == (0, 0)
