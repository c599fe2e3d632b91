"""proxy.dialects.breakpoints: the last mark found from the end is the last of all marks, in the cache's order."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from proxy.dialects.breakpoints import last_mark, marks

controls = st.sampled_from([{"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}, "not a dict"])
leaf = st.fixed_dictionaries({"type": st.sampled_from(["text", "image"])}, optional={"cache_control": controls})
tool_result = st.fixed_dictionaries(
    {"type": st.just("tool_result"), "content": st.one_of(st.text(max_size=3), st.lists(leaf, max_size=3))},
    optional={"cache_control": controls},
)
block = st.one_of(leaf, tool_result, st.text(max_size=3), st.none())
content = st.one_of(st.text(max_size=3), st.lists(block, max_size=4))
message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": content}), st.none()
)
body = st.fixed_dictionaries(
    {},
    optional={
        "messages": st.one_of(st.lists(message, max_size=5), st.text(max_size=2)),
        "system": st.one_of(st.text(max_size=3), st.lists(leaf, max_size=3)),
        "tools": st.lists(leaf, max_size=3),
    },
)


@settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "400")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(body)
@example(  # a tool result's own mark comes after its inner blocks' marks
    {
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "content": [{"type": "text", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
                        "cache_control": {"type": "ephemeral"},
                    },
                    "a block that is no object",
                ],
            },
            {"role": "assistant", "content": "unmarked"},
        ],
        "system": [{"type": "text", "cache_control": {"type": "ephemeral"}}],
    }
)
def test_the_last_mark_found_from_the_end_is_the_last_of_every_mark_in_the_caches_order(request: dict) -> None:
    found = marks(request)
    assert last_mark(request) == (found[-1] if found else None)
