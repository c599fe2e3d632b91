"""Lines a tool stamps on each run of a command, which say nothing about its output: seen through by dedup.

Two runs of `seq 1 20000` give the same output, but Codex puts a fresh chunk id and wall time
above each, so their bytes never match. `unstamped(text)` is the text without those stamps,
what dedup compares (the reference it sends names the earlier call; the stamps are dropped
with the duplicate). Recognised, and only where the tool puts them:

- Codex CLI's header above a command's output (`exec_command`, `write_stdin`): the lines
  `Chunk ID: <hex>`, `Wall time: <seconds> seconds` and `Process running with session ID <n>`,
  before its `Output:` line;
- pytest's closing line: the duration in `==== 3 passed in 0.12s ====` (and `(0:01:02)`).

Anything else is compared as it is: a timestamp a command prints (`date`) is its output.
"""

from __future__ import annotations

import re

_CODEX_HEAD = "Chunk ID: "
_CODEX_STAMP = re.compile(
    r"Chunk ID: [0-9a-f]+|Wall time: [0-9]+(?:\.[0-9]+)? seconds|Process running with session ID [0-9]+"
)
_CODEX_HEADER_LINES = 8  # the header is a few lines; the output starts after `Output:`
# pytest's summary: `==== 1 failed, 2 passed in 0.12s (0:00:00) ====`, the last line of its output.
_PYTEST_DURATION = re.compile(r"( in )[0-9]+(?:\.[0-9]+)?s(?: \([0-9:]+\))?( =+\s*)$")
_TAIL_CHARS = 400


def unstamped(text: str) -> str:
    """`text` without the stamps above (the text itself when it has none)."""
    if text.startswith(_CODEX_HEAD):
        text = _without_codex_header_stamps(text)
    tail = text[-_TAIL_CHARS:]
    if " in " in tail and "=" in tail:
        cleaned = _PYTEST_DURATION.sub(r"\1\2", tail)
        if cleaned != tail:
            text = text[: len(text) - len(tail)] + cleaned
    return text


def _without_codex_header_stamps(text: str) -> str:
    lines = text.split("\n", _CODEX_HEADER_LINES)
    kept: list[str] = []
    for k, line in enumerate(lines[:_CODEX_HEADER_LINES]):
        if line == "Output:":
            return "\n".join([*kept, *lines[k:]])
        if not _CODEX_STAMP.fullmatch(line):
            kept.append(line)
    return text  # no `Output:` line where Codex puts it: not its header
