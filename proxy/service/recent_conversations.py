"""The last conversations each client's session names mapped from Messages and Responses bodies, for the next
body's equal messages.

A Messages or Responses body is parsed whole every turn (no byte-level memo as chat's: Claude Code moves its last
breakpoint, so the previous body's bytes never lead the next one), and mapping every message to engine messages
and digests again was most of a long session's warm turn. The dialect takes the engine messages of each message
equal to the one at its place in a conversation it was given (`Dialect.conversation`'s `previous`), so these are
kept: per client and session name, the last few conversations (one per conversation the name holds), within a byte
budget (a share of `[state] memory_mb`), the least recently used going first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from proxy.dialects import Conversation

PER_SCOPE = 8  # conversations kept per client and session name (subagents share their parent's name)
# What a kept conversation holds per byte of its messages' JSON: that JSON (`made_from`), the engine messages and
# (Responses) the body's items its groups keep. tracemalloc, a 100k-token session: Messages 2.6, Responses 3.4.
BYTES_PER_MESSAGE_BYTE = 3.5


class RecentConversations:
    """Conversations by scope, most recent first; `held` is what they hold, roughly, in bytes."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.held = 0
        self._scopes: OrderedDict[str, list[tuple[Conversation, int]]] = OrderedDict()
        self._lock = threading.Lock()  # mapping may run on the engine's worker thread

    def candidates(self, scope: str) -> list[Conversation]:
        with self._lock:
            return [conversation for conversation, _ in self._scopes.get(scope, ())]

    def remember(self, scope: str, conversation: Conversation) -> None:
        """Keep `conversation` as its scope's most recent; one it continues (the same first message) goes."""
        size = int(BYTES_PER_MESSAGE_BYTE * sum(map(len, conversation.made_from)))
        if not conversation.made_from or size > self.budget:
            return
        first = conversation.made_from[0]
        with self._lock:
            kept = self._scopes.pop(scope, [])
            stale = [entry for entry in kept if entry[0].made_from[0] == first]
            kept = [entry for entry in kept if entry[0].made_from[0] != first]
            kept.insert(0, (conversation, size))
            self.held += size - sum(entry[1] for entry in stale)
            while len(kept) > PER_SCOPE:
                self.held -= kept.pop()[1]
            self._scopes[scope] = kept
            while self.held > self.budget and self._scopes:
                _, dropped = self._scopes.popitem(last=False)
                self.held -= sum(entry[1] for entry in dropped)

    def fit(self, budget_bytes: int) -> None:
        """Hold at most `budget_bytes` from now on (a config reload's budget)."""
        with self._lock:
            self.budget = budget_bytes
            while self.held > self.budget and self._scopes:
                _, dropped = self._scopes.popitem(last=False)
                self.held -= sum(entry[1] for entry in dropped)
