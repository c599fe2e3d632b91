"""What the engine service's caches may hold of `[state] memory_mb`; the sessions have the rest (and what the
caches leave unused), so sessions, body memos and cut contents together stay within it."""

from __future__ import annotations

from proxy.config.settings import StateConfig

# The body memos take at most a quarter (128 MB of the default 512, more than body_memo_mb's 64).
MEMO_SHARE = 4
# The cut contents at most a sixteenth (32 MB of 512): a cut is at most `max_message_share` of a window (~200 KB
# of text at 200k), so some 160 of the largest, or thousands of the usual ones.
CUT_SHARE = 16
# The last bodies sent upstream at most an eighth (64 MB of 512): one per recent session, about three times its bytes.
SENT_SHARE = 8
# The last conversations mapped from Messages bodies (`proxy.service.recent_conversations`) at most an eighth (64 MB
# of 512): a 100k-token session's takes ~1.2 MB (Messages) to ~1.7 MB (Responses) there.
CONVERSATION_SHARE = 8
# The specific tokens of long texts (`proxy.context.recall.TokenSets`) at most a thirty-second (16 MB of 512): a
# 100k-token session's outputs take ~1 MB there.
TOKEN_SHARE = 32


def memo_budget(state: StateConfig) -> int:
    """The body memos' bytes: `body_memo_mb`, within their share of `memory_mb`."""
    return min(state.body_memo_bytes, state.memory_bytes // MEMO_SHARE)


def cut_budget(state: StateConfig) -> int:
    """The cut contents' bytes (`proxy.context.steps.CutCache`): their share of `memory_mb`."""
    return state.memory_bytes // CUT_SHARE


def sent_budget(state: StateConfig) -> int:
    """The sent bodies' bytes (`proxy.service.sent_bodies`): their share of `memory_mb`, none without body memos
    (a body parsed whole never has the very objects of the last one)."""
    return min(memo_budget(state), state.memory_bytes // SENT_SHARE)


def token_budget(state: StateConfig) -> int:
    """The kept specific tokens' bytes (`proxy.context.recall.TOKEN_SETS`): their share of `memory_mb`."""
    return state.memory_bytes // TOKEN_SHARE


def conversation_budget(state: StateConfig) -> int:
    """The recent Messages conversations' bytes (`proxy.service.recent_conversations`): their share of `memory_mb`."""
    return state.memory_bytes // CONVERSATION_SHARE
