"""Whether a request still holds every line of the tool outputs it was made from (what `lossless` promises)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from proxy.context.messages import content_text


def lines_standing(messages: Sequence[dict]) -> set[str]:
    """Every line of every message's text, as sent."""
    return {line for m in messages for line in (content_text(m) or "").split("\n")}


def missing_lines(original: dict, request: Sequence[dict]) -> list[str]:
    """The lines of `original` that stand in no message of `request`."""
    standing = lines_standing(request)
    return [line for line in (content_text(original) or "").split("\n") if line not in standing]


POINTER = re.compile(r"^\[(\d+) lines here are lines (\d+)-(\d+) of (.+), unchanged\]$")
REPEAT = re.compile(r"^\[previous line repeated (\d+) more times\]$")


def expanded(request: Sequence[dict], at: int, outputs: Sequence[bool] | None = None) -> str:
    """The text of `request[at]` with every compaction pointer replaced by the lines it names, read from the
    outputs before it as sent (their own pointers expanded): what an agent following the pointers reads.

    `outputs[k]`: whether `request[k]` renders a tool output (default: a `tool` message)."""
    if outputs is None:
        outputs = [m.get("role") == "tool" for m in request]
    return "\n".join(_expand(request, at, (content_text(request[at]) or "").split("\n"), outputs))


def _expand(request: Sequence[dict], at: int, sent: list[str], outputs: Sequence[bool]) -> list[str]:
    lines: list[str] = []
    for line in sent:
        if pointer := POINTER.match(line):
            source = _source(request, at, pointer[4], outputs)
            named = (content_text(request[source]) or "").split("\n")[int(pointer[2]) - 1 : int(pointer[3])]
            lines.extend(_expand(request, source, named, outputs))  # what it points at may point on
        elif repeat := REPEAT.match(line):
            lines.extend([lines[-1]] * int(repeat[1]))
        else:
            lines.append(line)
    return lines


def _source(request: Sequence[dict], at: int, label: str, outputs: Sequence[bool]) -> int:
    """The index in `request` of the output a pointer in `request[at]` names by `label`."""
    if label == "this output":
        return at
    if label.startswith("the output of call "):
        call = label.removeprefix("the output of call ").removesuffix(" above")
        return next(k for k in range(at - 1, -1, -1) if request[k].get("tool_call_id") == call)  # the nearest
    back = 1 if label == "the previous output" else int(label.split()[2])
    return [k for k in range(at) if outputs[k]][-back]
