"""Cuts: a message (not the last, nor the newest) that alone exceeds `max_message_share` of the window keeps its head
and tail."""

from __future__ import annotations

from typing import Any

from proxy.context.draft import Draft
from proxy.context.fitting import cut_oversized, never_cut, oversized_limit
from proxy.context.journal import AS_SENT, CUT, Decision, TurnReport
from proxy.context.lru import ByteLru
from proxy.context.messages import Message, content_bytes, content_text, newest
from proxy.context.steps.base import Epoch
from proxy.context.tokens import Counter

ENTRY_BYTES = 300  # an entry's key (digest, allowance), its tuple and its place in the ordered dict


class CutCache(ByteLru[tuple[bytes, int], Any]):
    """Cut contents by (message digest, allowance): re-cutting would re-tokenize a huge text every turn.

    Bounded in bytes (`max_bytes`, a share of `[state] memory_mb`), the least recently used cut evicted first;
    `held` is what it holds now. The caller owns it (one per engine service) and may share it between threads.
    """

    def __init__(self, max_bytes: int = 32 * 1024 * 1024) -> None:
        super().__init__(max_bytes)

    def cut(self, message: Message, digest: bytes, max_tokens: int, counter: Counter) -> Message:
        """The head+tail cut of `message` within `max_tokens` (the message itself when it already fits, or has no
        text of its own: an opaque one, thinking or reasoning, whose content carries an estimate that follows the
        learned scale under the same digest, so a kept content could differ from it)."""
        if content_text(message) is None:
            return message
        key = (digest, max_tokens)
        content = self.get(key)
        if content is None:
            cut = cut_oversized(message, counter, max_tokens)
            content = message.get("content") if cut is None else cut["content"]
            self.put(key, content, ENTRY_BYTES + content_bytes(content))
        return {**message, "content": content}


class Cutting:
    kind = CUT

    def __init__(self, cache: CutCache) -> None:
        self.cache = cache

    def emit(self, draft: Draft, i: int, decision: Decision) -> Message:
        return self.cache.cut(draft.messages[i], draft.journal.digests[i], decision.max_tokens, draft.counter)

    def edit(self, draft: Draft, epoch: Epoch, report: TurnReport) -> None:
        """Cut every kept message but the last and the newest (`messages.newest`) that alone exceeds
        `max_message_share` of the window; never the instructions (system, developer) nor the task
        (`fitting.never_cut`)."""
        if not epoch.over_budget:
            return
        limit = oversized_limit(draft.usable, draft.policy.max_message_share)
        journal = draft.journal
        kept = never_cut(draft.messages, draft.policy.pin_first_user)
        unread = newest(draft.messages)
        for i in draft.visible()[:-1]:
            if i == unread or journal.decisions[i] is not AS_SENT or journal.sent[i] <= limit or kept[i]:
                continue
            self.cut(draft, i, limit, report)

    def cut(self, draft: Draft, i: int, max_tokens: int, report: TurnReport) -> None:
        """Record a cut of client message `i` within `max_tokens`, when that cuts anything."""
        message = draft.messages[i]
        # The cache keeps the cut made here, so recording the decision below does not cut the message again.
        cut = self.cache.cut(message, draft.journal.digests[i], max_tokens, draft.counter)
        if cut["content"] != message.get("content"):
            draft.decide(i, Decision(CUT, max_tokens=max_tokens))
            report.cut += 1
