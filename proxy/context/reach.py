"""How far back an agent reaches: of what its messages use from tool outputs, the share only older outputs held.

Per turn, the agent's newest message (new this turn) is read against what the client sent before it: its
specific tokens (`recall.specific_tokens`) that a tool output held are its evidence, as `bench quality` counts
it, and those only outputs older than the newest held (no other message, not the system or the task) are
what clearing every output but the newest would have cost it. The session adds both up (`RecallIndex`); a
finished session's sums join its agent's history (`proxy.state.lifetimes`), and an agent whose sessions
rarely reached back is trusted to work from the newest output (`Reach.trusts_newest`, read by
`steps/clear.py`). Measured on the client's messages, not on what was sent: what the proxy cleared does not
bias it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from proxy.context.messages import INSTRUCTION_ROLES, Message, content_text
from proxy.context.recall import call_arguments

# At most this many of a message's tokens are looked for (the longest first: the most specific): a message that
# writes a file's worth of new code costs a bounded search.
MAX_TOKENS = 24
# A session's count stops at this much evidence: enough to say how far it reaches, no one long session outweighs the
# agent's others, and its later turns pay no search (~130 us a turn on the sampled runs, growing with the session).
MAX_SESSION_EVIDENCE = 400
# The history trusts an agent only past this much: finished sessions, and evidence tokens over them.
MIN_SESSIONS = 3
MIN_EVIDENCE = 30
# An agent whose finished sessions reached back for at most this share of their evidence is trusted to work from
# the newest output: clearing the rest loses it about this share. Half issue 27's budget (0.04), as the history is
# an estimate: mini-swe-agent's is 0.088 over its 13 tuned runs but 0.048 after its first four (0.035 before the
# 400-token cap per session, when 0.04 trusted 3 sample A runs in `bench reach`'s history pass: lost 0.044).
TRUST_SHARE = 0.02


@dataclass(frozen=True)
class Reach:
    """One agent's finished sessions: their evidence tokens, and how many of them only older outputs held."""

    sessions: int = 0
    evidence: int = 0
    older: int = 0

    @property
    def share(self) -> float | None:
        """The share of evidence that reached past the newest output (None: no evidence yet)."""
        return self.older / self.evidence if self.evidence else None

    def trusts_newest(self) -> bool:
        """Enough history, and it says the agent works from the newest output: clearing may keep that alone."""
        share = self.share
        return (
            self.sessions >= MIN_SESSIONS
            and self.evidence >= MIN_EVIDENCE
            and share is not None
            and share <= TRUST_SHARE
        )

    def summary(self) -> dict[str, object]:
        """What `/sessions/{id}` shows beside the turns to come."""
        share = self.share
        return {
            "history_reach_back": None if share is None else round(share, 3),
            "trusts_newest_output": self.trusts_newest(),
        }


NO_REACH = Reach()


def reach_of(messages: Sequence[Message], a: int, outputs: Sequence[int], tokens: frozenset[str]) -> tuple[int, int]:
    """The agent's message `messages[a]` (its specific `tokens`), read against the client's messages before it
    (`outputs`: the indices of their tool outputs): its evidence tokens, and how many of them only outputs
    older than the newest one held."""
    outputs = [i for i in outputs if i < a]
    wanted = sorted(tokens, key=lambda t: (-len(t), t))[:MAX_TOKENS]
    if not outputs or not wanted:
        return 0, 0
    instructions = [i for i in range(a) if messages[i].get("role") in INSTRUCTION_ROLES]
    task = next((i for i in range(a) if messages[i].get("role") == "user"), None)
    fixed = [_text(messages[i]) for i in (*instructions, *(() if task is None else (task,)))]
    newest = content_text(messages[outputs[-1]]) or ""
    skip = {*outputs, *instructions, task}
    others = _Texts(messages, [i for i in range(a - 1, -1, -1) if i not in skip])  # read newest first, as needed
    earlier: str | None = None  # the older outputs' texts, joined once a token needs them (one search each)
    evidence = older = 0
    for token in wanted:
        if any(_holds(text, token) for text in fixed):
            continue
        if _holds(newest, token):
            evidence += 1
            continue
        if earlier is None:
            earlier = "\n".join(content_text(messages[i]) or "" for i in outputs[:-1])
        if not _holds(earlier, token):
            continue
        evidence += 1
        older += not any(_holds(text, token) for text in others)
    return evidence, older


class _Texts:
    """The texts of `messages[i]` for each of `order`, each made once, when first iterated to (an output's content,
    a message's content and call arguments)."""

    def __init__(self, messages: Sequence[Message], order: list[int]) -> None:
        self.messages, self.order = messages, order
        self.made: list[str] = []

    def __iter__(self) -> Iterator[str]:
        yield from self.made
        for i in self.order[len(self.made) :]:
            self.made.append(_text(self.messages[i]))
            yield self.made[-1]


def _text(message: Message) -> str:
    parts = [content_text(message) or ""]
    if message.get("role") == "assistant":
        parts += call_arguments(message)
    return "\n".join(parts)


def _holds(text: str, token: str) -> bool:
    """`token` stands in `text` as a whole word (no letter, digit or `_` either side): as a specific token."""
    start = text.find(token)
    while start >= 0:
        end = start + len(token)
        if (start == 0 or not _word(text[start - 1])) and (end == len(text) or not _word(text[end])):
            return True
        start = text.find(token, start + 1)
    return False


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"
