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

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.context.messages import INSTRUCTION_ROLES, Message, content_text

# At most this many of a message's tokens are looked for (the longest first: the most specific): a message that
# writes a file's worth of new code costs a bounded search.
MAX_TOKENS = 24
# The messages before the agent's that are read for it (about 20 of its calls and their outputs).
WINDOW = 40
# A session's count stops at this much evidence: enough to say how far it reaches, no one long session outweighs the
# agent's others, and its later turns pay no search (~70 us a turn on the sampled runs; the agent's message is
# tokenized for it too until the session's first edit, when the recall-miss check needs it anyway).
MAX_SESSION_EVIDENCE = 400
# The history trusts an agent only past this much: finished sessions, and evidence tokens over them.
MIN_SESSIONS = 3
MIN_EVIDENCE = 30
# An agent whose finished sessions reached back for at most this share of their evidence is trusted to work from
# the newest output: clearing the rest loses it about this share. Half issue 27's budget (0.04), as the history is
# an estimate: mini-swe-agent's is 0.085 over its 13 tuned runs but 0.041 after its first four (0.035 read without
# the cap and the window, when 0.04 trusted 3 sample A runs in `bench reach`'s history pass: lost 0.044).
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


def reach_of(messages: Sequence[Message], a: int, is_output: Sequence[bool], tokens: frozenset[str]) -> tuple[int, int]:
    """The agent's message `messages[a]` (its specific `tokens`), read against the `WINDOW` messages before it
    (`is_output[i]`: message i is a tool output) and what is never edited (the first system message and the
    task): its evidence tokens, and how many of them only outputs older than the newest one held.

    Outputs further back are not read (a turn's work stays bounded, whatever the session's length): what only
    they held counts as neither, and a message the agent wrote further back does not make a token safe."""
    start = max(0, a - WINDOW)
    outputs = [i for i in range(start, a) if is_output[i]]
    wanted = sorted(tokens, key=lambda t: (-len(t), t))[:MAX_TOKENS]
    if not outputs or not wanted:
        return 0, 0
    fixed = "\n".join(_text(messages[i]) for i in _never_edited(messages, a))
    newest = content_text(messages[outputs[-1]]) or ""
    earlier: str | None = None  # the older outputs' texts, joined once a token needs them (one search each)
    others: str | None = None  # the other messages' (the agent's, the user's), likewise
    evidence = older = 0
    for token in wanted:
        if _holds(fixed, token):
            continue
        if _holds(newest, token):
            evidence += 1
            continue
        if earlier is None:
            earlier = "\n".join(content_text(messages[i]) or "" for i in outputs[:-1])
        if not _holds(earlier, token):
            continue
        evidence += 1
        if others is None:
            kept = set(outputs)
            others = "\n".join(_text(messages[i]) for i in range(start, a) if i not in kept)
        older += not _holds(others, token)
    return evidence, older


def _never_edited(messages: Sequence[Message], a: int) -> list[int]:
    """The first system (or developer) message and the first user message before `a`: the instructions and the
    task, which no edit removes (`recall.never_edited` reads every system message; the first is the one that
    holds the agent's instructions)."""
    found: list[int] = []
    roles: set[str] = set()
    for i in range(a):
        role = messages[i].get("role")
        kind = "system" if role in INSTRUCTION_ROLES else role
        if kind in ("system", "user") and kind not in roles:
            roles.add(kind)
            found.append(i)
            if len(roles) == 2:
                break
    return found


def _text(message: Message) -> str:
    """The message's text and, for an assistant, its calls' arguments as sent (JSON text, not parsed: a name in
    them stands there as a word all the same, unless an escape runs into it)."""
    text = content_text(message) or ""
    calls = message.get("tool_calls") if message.get("role") == "assistant" else None
    if not calls:
        return text
    parts = [text]
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts.append(str(function.get("arguments") or ""))
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
