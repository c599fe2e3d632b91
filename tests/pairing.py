"""What an upstream checks about tool calls and their results: the invariant every edit must keep."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.context.messages import Message, call_ids, units


def check_pairing(messages: Sequence[Message]) -> list[str]:
    """Why an upstream would refuse this list's tool calls and results; [] when it would not."""
    problems: list[str] = []
    for start, end in units(messages):
        first = messages[start]
        if first.get("role") == "tool":
            problems.append(
                f"message {start}: tool result for call {first.get('tool_call_id')!r} "
                "does not follow the assistant message that made the call"
            )
            continue
        answered = [str(m.get("tool_call_id")) for m in messages[start + 1 : end]]
        for call_id in call_ids(first):
            if call_id in answered:
                answered.remove(call_id)
            else:
                problems.append(f"message {start}: call {call_id!r} has no result")
    return problems
