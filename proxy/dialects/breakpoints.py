"""Where the proxy puts Anthropic cache breakpoints (`cache_control`), never more than 4 in a request.

A client that marks none gets three: the system prompt, the last message (what this turn
writes, so the next one reads it) and the frontier. A client that marks its own keeps them
all and gets the frontier if a slot is free. The frontier is the end of the assistant turn
before the oldest tool result the engine has not cleared: the prefix up to there is written
every turn, so when an edit epoch clears from there on, the request reads everything before
it from the cache and rewrites only what follows (the cost the epoch rule counts).
"""

from __future__ import annotations

from typing import Any

from proxy.context.clearing import PLACEHOLDER

MAX_BREAKPOINTS = 4
EPHEMERAL = {"type": "ephemeral"}
UNMARKABLE = frozenset({"thinking", "redacted_thinking"})  # the API refuses cache_control on these
FRONTIER_MIN_CHARS = 400  # a tool result shorter than this is never cleared (policy keep_under), so no frontier
NEAR_END = 3  # a frontier this close to the last message adds nothing: the last breakpoint's lookback covers it


def _blocks(content: Any) -> list[Any]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])


def count(body: dict[str, Any]) -> int:
    """Breakpoints in the request: on tools, system blocks, message blocks and blocks inside tool results."""
    marks = sum(1 for tool in body.get("tools") or [] if isinstance(tool, dict) and "cache_control" in tool)
    blocks = _blocks(body.get("system")) if isinstance(body.get("system"), list) else []
    for message in body["messages"]:
        content = message.get("content")
        blocks += content if isinstance(content, list) else []
    for block in blocks:
        if isinstance(block, dict):
            marks += "cache_control" in block
            inner = block.get("content")
            marks += (
                sum(1 for b in inner if isinstance(b, dict) and "cache_control" in b) if isinstance(inner, list) else 0
            )
    return marks


def _mark(content: Any) -> list[Any] | None:
    """The content with its last markable block marked, or None when no block can carry a breakpoint."""
    blocks = _blocks(content)
    for j in range(len(blocks) - 1, -1, -1):
        block = blocks[j]
        if isinstance(block, dict) and block.get("type") not in UNMARKABLE:
            blocks[j] = {**block, "cache_control": EPHEMERAL}
            return blocks
    return None


def _cleared_or_short(block: dict[str, Any]) -> bool:
    content = block.get("content")
    text = content if isinstance(content, str) else "".join(str(b.get("text", "")) for b in _blocks(content))
    return text == PLACEHOLDER or len(text) < FRONTIER_MIN_CHARS


def frontier(messages: list[Any]) -> int | None:
    """The message before the oldest user message with a tool result still to clear, unless near the end."""
    for i, message in enumerate(messages):
        results = [b for b in _blocks(message.get("content")) if isinstance(b, dict) and b.get("type") == "tool_result"]
        if i and message.get("role") == "user" and any(not _cleared_or_short(b) for b in results):
            return i - 1 if i - 1 < len(messages) - NEAR_END else None
    return None


def with_breakpoints(body: dict[str, Any]) -> dict[str, Any]:
    """The body with the proxy's breakpoints added where slots are free (a new dict; the client's is untouched)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return body
    marks = count(body)
    wanted = (
        [] if marks >= MAX_BREAKPOINTS else ([frontier(messages)] if marks else [frontier(messages), len(messages) - 1])
    )
    out = dict(body)
    if not marks and body.get("system") and (system := _mark(body["system"])) is not None:
        out["system"] = system
    marked = list(messages)
    for i in {i for i in wanted if i is not None}:
        content = _mark(marked[i].get("content"))
        if content is not None:
            marked[i] = {**marked[i], "content": content}
    out["messages"] = marked
    return out
