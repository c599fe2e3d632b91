"""Where the proxy puts Anthropic cache breakpoints (`cache_control`), never more than 4 in a request.

A client that marks none gets the system prompt, the last message (what this turn writes, so
the next one reads it), the frontier and the stand-in point. A client that marks its own keeps
them and gets the frontier, then the stand-in point, while slots are free. The frontier is the
end of the assistant turn before the oldest tool result the engine has not cleared: the prefix
up to there is written every turn, so when an edit epoch clears from there on, the request
reads everything before it from the cache and rewrites only what follows (the cost the epoch
rule counts). The stand-in point is the end of the message before a last user message: next
turn that message may go compacted (`steps/compact.py`), and the cache then holds everything
before it, as the compaction's price counts. Anthropic keeps a prefix only where a request
marked one: without this mark the cache's last entry before it is the previous turn's end, and
the stand-in re-wrote the assistant reply between at 1.25x (a 31 KB reply: 1.18 of direct on a
held-out run, `python -m bench fleet --api messages`). A mark costs nothing by itself: writes
are billed by the tokens up to the last breakpoint.

A client that marks more than 4 (the API refuses the request) keeps its last 4 in the order
the cache reads them (tools, system, messages): the last marks cache the longest prefixes,
and the last one writes what the next turn reads. A mark the proxy adds before a client's
1-hour mark asks for 1 hour too (the API takes 1-hour marks only before 5-minute ones).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.context.clearing import FRONTIER_MIN_CHARS, is_cleared
from proxy.dialects.blocks import content_blocks

MAX_BREAKPOINTS = 4
EPHEMERAL = {"type": "ephemeral"}
ONE_HOUR = {"type": "ephemeral", "ttl": "1h"}
UNMARKABLE = frozenset({"thinking", "redacted_thinking"})  # the API refuses cache_control on these
NEAR_END = 3  # a frontier this close to the last message adds nothing: the last breakpoint's lookback covers it

# A block's replacement, or None to leave it as it is.
Visit = Callable[[dict[str, Any]], dict[str, Any] | None]


def _visit_list(items: Any, visit: Visit) -> list[Any] | None:
    """A list of blocks with `visit`'s replacements, or None when none changed (or `items` is no list)."""
    if not isinstance(items, list):
        return None
    out: list[Any] | None = None
    for j, item in enumerate(items):
        new = _visit_block(item, visit) if isinstance(item, dict) else None
        if new is not None:
            out = out if out is not None else list(items)
            out[j] = new
    return out


def _visit_block(block: dict[str, Any], visit: Visit) -> dict[str, Any] | None:
    """The blocks inside a block (a tool result's) come before its end, so they are visited first."""
    inner = _visit_list(block.get("content"), visit)
    own = {**block, "content": inner} if inner is not None else block
    new = visit(own)
    return new if new is not None else (own if inner is not None else None)


def _visit(body: dict[str, Any], visit: Visit) -> dict[str, Any]:
    """`body` with `visit` applied to every block that may carry a breakpoint, in the order the cache reads them.

    Only what changed is copied: the client's body is never edited in place.
    """
    out = body
    for key in ("tools", "system"):
        if (new := _visit_list(body.get(key), visit)) is not None:
            out = {**out, key: new}
    messages: list[Any] | None = None
    for i, message in enumerate(body.get("messages") or []):
        content = _visit_list(message.get("content"), visit) if isinstance(message, dict) else None
        if content is not None:
            messages = messages if messages is not None else list(body["messages"])
            messages[i] = {**message, "content": content}
    return out if messages is None else {**out, "messages": messages}


TOOLS, SYSTEM = -2, -1  # where a mark stands (`located`), before the messages' indices


def _collect(items: Any, where: int, found: list[tuple[int, Any]]) -> None:
    """The marks of a list of blocks, as `_visit` meets them (a block's inner blocks before the block)."""
    if not isinstance(items, list):
        return
    for item in items:
        if isinstance(item, dict):
            inner = item.get("content")
            if isinstance(inner, list):
                _collect(inner, where, found)
            if "cache_control" in item:
                found.append((where, item["cache_control"]))


def located(body: dict[str, Any]) -> list[tuple[int, Any]]:
    """The request's `cache_control` values in the order the cache reads them (tools, system, messages), each with
    where it stands: `TOOLS`, `SYSTEM` or its message's index. One walk of the body, copying nothing."""
    found: list[tuple[int, Any]] = []
    _collect(body.get("tools"), TOOLS, found)
    _collect(body.get("system"), SYSTEM, found)
    for i, message in enumerate(body.get("messages") or []):
        if isinstance(message, dict):
            _collect(message.get("content"), i, found)
    return found


def marks(body: dict[str, Any]) -> list[Any]:
    """The request's `cache_control` values in the order the cache reads them: tools, system, messages."""
    return [control for _, control in located(body)]


def count(body: dict[str, Any]) -> int:
    """Breakpoints in the request: on tools, system blocks, message blocks and blocks inside tool results."""
    return len(located(body))


def is_one_hour(control: Any) -> bool:
    return isinstance(control, dict) and control.get("ttl") == "1h"


def _last_in(items: Any) -> tuple[bool, Any]:
    """The last mark of a list of blocks in the order `_collect` meets them (a block after its inner blocks), found
    from the end: (found, its `cache_control`)."""
    if isinstance(items, list):
        for item in reversed(items):
            if isinstance(item, dict):
                if "cache_control" in item:
                    return True, item["cache_control"]
                found = _last_in(item.get("content"))
                if found[0]:
                    return found
    return False, None


def last_mark(body: dict[str, Any]) -> Any:
    """The `cache_control` of the request's last breakpoint in the order the cache reads them (`marks(body)[-1]`),
    or None; searched from the end, so a client that marks its last message costs no walk of the others."""
    messages = body.get("messages")
    listed: list[Any] = messages if isinstance(messages, list) else []
    for message in reversed(listed):
        if isinstance(message, dict) and (found := _last_in(message.get("content")))[0]:
            return found[1]
    for key in ("system", "tools"):
        if (found := _last_in(body.get(key)))[0]:
            return found[1]
    return None


def last_is_one_hour(body: dict[str, Any]) -> bool:
    """Whether the request's last breakpoint asks for the 1-hour TTL: what an edit re-writes is then kept 1 hour."""
    return is_one_hour(last_mark(body))


def capped(body: dict[str, Any], taken: int | None = None) -> dict[str, Any]:
    """The body with at most 4 breakpoints: the first ones beyond that lose their mark (a new dict if any did).
    `taken`: its breakpoints, when the caller has counted them."""
    excess = (count(body) if taken is None else taken) - MAX_BREAKPOINTS
    if excess <= 0:
        return body

    def unmark(block: dict[str, Any]) -> dict[str, Any] | None:
        nonlocal excess
        if excess <= 0 or "cache_control" not in block:
            return None
        excess -= 1
        return {k: v for k, v in block.items() if k != "cache_control"}

    return _visit(body, unmark)


def _mark(content: Any, control: dict[str, str]) -> list[Any] | None:
    """The content with its last markable block marked, or None when it cannot or does already carry one."""
    blocks = content_blocks(content)
    for j in range(len(blocks) - 1, -1, -1):
        block = blocks[j]
        if isinstance(block, dict) and block.get("type") not in UNMARKABLE:
            if "cache_control" in block:
                return None
            blocks[j] = {**block, "cache_control": control}
            return blocks
    return None


def _cleared_or_short(block: dict[str, Any]) -> bool:
    content = block.get("content")
    text = content if isinstance(content, str) else "".join(str(b.get("text", "")) for b in content_blocks(content))
    return is_cleared(text) or len(text) < FRONTIER_MIN_CHARS


def frontier(messages: list[Any]) -> int | None:
    """The message before the oldest user message with a tool result still to clear, unless near the end."""
    for i, message in enumerate(messages):
        results = [
            b for b in content_blocks(message.get("content")) if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        if i and message.get("role") == "user" and any(not _cleared_or_short(b) for b in results):
            return i - 1 if i - 1 < len(messages) - NEAR_END else None
    return None


def stand_in_point(messages: list[Any]) -> int | None:
    """The message before a last user message (which may go compacted next turn), unless it is the first."""
    last = len(messages) - 1
    return last - 1 if last >= 2 and isinstance(messages[last], dict) and messages[last].get("role") == "user" else None


def with_breakpoints(body: dict[str, Any], place: bool = True) -> dict[str, Any]:
    """The body with at most 4 breakpoints and (`place`) the proxy's where slots are free; the client's is untouched."""
    found = located(body)
    capped_body = capped(body, len(found))
    if capped_body is not body:
        body, found = capped_body, located(capped_body)
    messages = body.get("messages")
    if not place or not isinstance(messages, list) or not messages:
        return body
    taken = len(found)
    out = dict(body)
    if not taken and body.get("system") and (system := _mark(body["system"], EPHEMERAL)) is not None:
        out["system"] = system
        taken = 1
    wanted = (
        [frontier(messages), stand_in_point(messages)]
        if found
        else [len(messages) - 1, frontier(messages), stand_in_point(messages)]
    )
    slots = MAX_BREAKPOINTS - taken
    marked = list(messages)
    for i in dict.fromkeys(i for i in wanted if i is not None):  # in order of worth, each once
        if slots <= 0:
            break
        later = any(is_one_hour(control) for where, control in found if where > i)  # the client's, after message i
        content = _mark(marked[i].get("content"), ONE_HOUR if later else EPHEMERAL)
        if content is not None:
            marked[i] = {**marked[i], "content": content}
            slots -= 1
    out["messages"] = marked
    return out
