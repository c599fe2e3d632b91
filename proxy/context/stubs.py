"""What a cleared output keeps: the lines the agent has quoted since it read them, then a note (SPEC §9).

Agents that read files in numbered windows (SWE-agent, OpenHands) come back to the lines they quoted: an
edit names `1474:1475`, a later thought names `_serialize`. Blanking the whole output loses them; the stub
keeps the output's first line (the file and window it shows) and, within a budget, the lines holding the
specific tokens (`recall.specific_tokens`) the agent wrote after reading it, in their order, followed by
a note saying how many lines went. Which lines stay is decided once, when the output is cleared, and
journaled (`encode`), so every later turn sends the same bytes from the client's own message.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.context.clearing import CLEARED_SUFFIX, PLACEHOLDER
from proxy.context.recall import specific_tokens
from proxy.context.tokens import Counter

# A first line longer than this is content, not a header naming the file or command: it stays only if quoted.
HEAD_MAX_CHARS = 200
# An output the agent quoted fewer of its specific tokens from goes whole: a stub for it costs more than it keeps.
MIN_QUOTED = 6
# The most lines kept on either side of a quoted line, budget permitting.
CONTEXT_LINES = 5


def choose_lines(text: str, quoted: frozenset[str], budget: int, counter: Counter) -> tuple[int, ...]:
    """The lines of `text` a stub keeps, within `budget` tokens: the first line when it is a header; greedily
    the line holding the most quoted tokens not yet kept (ties: the earlier line); then, while the budget
    lasts, the lines next to those, nearest first (`CONTEXT_LINES` at most): an agent that quoted line 1474
    comes back for 1475. () when no quoted token is in `text`: the output goes whole, as the placeholder."""
    lines = text.split("\n")
    hits = {i: found for i, line in enumerate(lines) if (found := specific_tokens(line) & quoted)}
    if budget <= 0 or len(frozenset().union(*hits.values())) < MIN_QUOTED:
        return ()
    chosen: set[int] = set()
    covered: set[str] = set()
    spent = 0

    def take(i: int) -> bool:
        nonlocal spent
        cost = counter.count_text(lines[i]) + 1
        if spent + cost > budget:
            return False
        chosen.add(i)
        spent += cost
        return True

    if len(lines[0]) <= HEAD_MAX_CHARS and take(0):
        covered |= hits.pop(0, frozenset())
    while hits:
        best = max(hits, key=lambda i: (len(hits[i] - covered), -i))
        new = hits.pop(best) - covered
        if not new:
            break
        if take(best):
            covered |= new
    if not covered:
        return ()
    anchors = sorted(chosen - {0})
    for distance in range(1, CONTEXT_LINES + 1):
        for a in anchors:
            for i in (a - distance, a + distance):
                if 0 < i < len(lines) and i not in chosen and not take(i):
                    return tuple(sorted(chosen))
    return tuple(sorted(chosen))


def render(text: str, lines: Sequence[int]) -> str:
    """The stub for `text` keeping `lines` (indices from `choose_lines`); the placeholder when none."""
    if not lines:
        return PLACEHOLDER
    all_lines = text.split("\n")
    kept = [all_lines[i] for i in lines if i < len(all_lines)]
    return "\n".join(kept) + f"\n[{len(all_lines) - len(kept)} more lines of this output {CLEARED_SUFFIX}"


def encode(lines: Sequence[int]) -> str:
    """The journal's form of kept lines: runs as `a-b`, joined by commas (`0,12-14,40`)."""
    runs: list[str] = []
    start = prev = -2
    for i in lines:
        if i == prev + 1:
            prev = i
            continue
        if start >= 0:
            runs.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = i
    if start >= 0:
        runs.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(runs)


def decode(reference: str) -> tuple[int, ...]:
    """The kept lines `encode` wrote (() for "")."""
    lines: list[int] = []
    for run in filter(None, reference.split(",")):
        first, _, last = run.partition("-")
        lines.extend(range(int(first), int(last or first) + 1))
    return tuple(lines)
