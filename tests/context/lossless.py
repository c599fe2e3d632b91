"""Whether a request still holds every line of the tool outputs it was made from (what `lossless` promises)."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.context.messages import content_text


def lines_standing(messages: Sequence[dict]) -> set[str]:
    """Every line of every message's text, as sent."""
    return {line for m in messages for line in (content_text(m) or "").split("\n")}


def missing_lines(original: dict, request: Sequence[dict]) -> list[str]:
    """The lines of `original` that stand in no message of `request`."""
    standing = lines_standing(request)
    return [line for line in (content_text(original) or "").split("\n") if line not in standing]
