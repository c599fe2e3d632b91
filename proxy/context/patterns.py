"""The operator's regexes (observation and error patterns), run by RE2: time linear in the text, whatever the pattern.

Python's `re` backtracks: `(?s:.*)\\(x: [^)]*\\)\\Z` searched over many repeats of `(x: ` takes time quadratic
in the text, and any client can send such a text. RE2 has no look-around, no backreferences and spells
Python's `\\Z` as `\\z`; a pattern it cannot run is refused when the policy is built (`pattern_problem`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import re2

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is reported once, by the config loader, not on stderr


class Pattern:
    """One compiled pattern; `search` says whether it occurs anywhere in the text."""

    __slots__ = ("_regexp", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self._regexp = re2.compile(source, _OPTIONS)

    def search(self, text: str) -> bool:
        # Bytes: RE2 matches UTF-8, and "surrogatepass" keeps a lone surrogate from raising.
        return self._regexp.search(text.encode("utf-8", "surrogatepass")) is not None

    def __repr__(self) -> str:
        return f"Pattern({self.source!r})"


def pattern_problem(patterns: Sequence[str]) -> str | None:
    """Why RE2 cannot run one of `patterns` (naming it), or None when all of them compile."""
    for source in patterns:
        if not isinstance(source, str):
            return f"{source!r} is not a string"
        try:
            Pattern(source)
        except re2.error as exc:
            reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
            return (
                f"the pattern {source!r} cannot run in linear time ({reason}): RE2 has no look-around or "
                "backreferences, and writes Python's \\Z as \\z"
            )
    return None


def compile_patterns(patterns: Sequence[str]) -> tuple[Pattern, ...]:
    """The patterns compiled, once per distinct list (every turn asks again for its policy's)."""
    return _compiled(tuple(patterns))


@lru_cache(maxsize=256)
def _compiled(patterns: tuple[str, ...]) -> tuple[Pattern, ...]:
    return tuple(Pattern(p) for p in patterns)
