"""`[policy] mode = "lossless"`: nothing removed that does not still stand elsewhere, unless the window forces it."""

from proxy.context.policy import Policy, policy_from_dict
from tests.context.lossless import missing_lines
from tests.context.replay import TRACE_NAMES, load, model, policy_for, run, turns


def _lines_gone(name: str, mode: str, window: int, counter) -> tuple[int, int]:
    """Over a trace at d = 1 (where clearing pays at once): lines of the client's messages standing nowhere in
    the request, and turns over the window."""
    trace = load(name)
    result = run(trace, policy_for(trace, mode=mode), model(window, 1.0), counter)
    gone = sum(
        len(missing_lines(message, sent))
        for request, sent in zip(turns(trace), result.requests, strict=True)
        for message in request
    )
    return gone, sum(outcome.overflow is not None for outcome in result.outcomes)


def test_lossless_keeps_every_line_of_every_packaged_trace_where_the_default_clears(real_counter):
    for name in TRACE_NAMES:
        assert _lines_gone(name, "lossless", 128000, real_counter) == (0, 0), name
    assert _lines_gone("mini_django-11138.tools.json", "default", 128000, real_counter)[0] > 100


def test_lossless_still_fits_a_session_the_window_cannot_hold(real_counter):
    """At 32k the window forces edits: lines go, and every turn is still answered."""
    gone, over = _lines_gone("mini_django-11138.tools.json", "lossless", 32000, real_counter)
    assert gone > 0 and over == 0


def test_a_mode_the_engine_does_not_know_is_refused():
    assert policy_from_dict({"mode": "lossless"}).lossless and not Policy().lossless
    try:
        policy_from_dict({"mode": "lossy"})
    except ValueError as error:
        assert "default, lossless" in str(error)
    else:
        raise AssertionError("mode = 'lossy' was taken")
