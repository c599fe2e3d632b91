"""Anthropic Messages requests as the simulator checks and bills them: blocks, breakpoints, signatures.

Billing follows Anthropic's explicit prompt caching: nothing is cached unless a block carries
`cache_control` (at most 4); a request reads the longest prefix an earlier request wrote at one
of its breakpoints, looked up at the block boundaries up to 20 blocks before each of this
request's breakpoints; it writes the prefix up to its last breakpoint (prefixes under 1,024
tokens are not cached). Tokens are the proxy's tiktoken count times `token_ratio`: the proxy has
no Claude tokenizer, so its estimate is off by a ratio it must learn.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from proxy.context.tokens import canonical_bytes
from proxy.tokens.counter import counter_for

_KEY = b"context-proxy simulator: thinking signature"  # a test upstream's key: what matters is that only it signs
LOOKBACK_BLOCKS = 20  # Anthropic checks for hits this many block boundaries before each breakpoint
MAX_BREAKPOINTS = 4
IMAGE_TOKENS = 1600  # what an image bills, whatever its size (a ~1.2 megapixel image)
UNCACHEABLE = ("thinking", "redacted_thinking")  # blocks that cannot carry cache_control
THINKING_RULE = (
    "When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the "
    "lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks from previous "
    "turns. To avoid this requirement, disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)


def sign(thinking: str) -> str:
    """The `signature` of a thinking block the simulator issues: only these pass `verify`."""
    mac = hmac.new(_KEY, thinking.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
    return base64.b64encode(b"EqQBCkYIBxgCKkD" + mac).decode()


def verify(thinking: Any, signature: Any) -> bool:
    return isinstance(thinking, str) and isinstance(signature, str) and hmac.compare_digest(signature, sign(thinking))


def blocks_of(content: Any) -> list[Any]:
    """A message's (or `system`'s) content as blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _block_text(block: dict[str, Any]) -> tuple[str, int]:
    """What a block is counted by: its text, and a fixed count for what is not text (images)."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", "")), 0
    if kind == "thinking":
        return str(block.get("thinking", "")), 0
    if kind == "redacted_thinking":
        return "", len(str(block.get("data", ""))) // 8
    if kind == "image":
        return "", IMAGE_TOKENS
    if kind == "tool_use":
        return str(block.get("name", "")) + canonical_bytes(block.get("input")).decode(), 0
    if kind == "tool_result":
        inner = [_block_text(b) for b in blocks_of(block.get("content")) if isinstance(b, dict)]
        return "\n".join(t for t, _ in inner), sum(n for _, n in inner) + 3
    return canonical_bytes(block).decode(), 0


@dataclass(frozen=True)
class Position:
    """A block boundary: the prefix up to it (digest, tokens), its breakpoint's TTL ("" when none), where it is."""

    digest: bytes
    tokens: int
    ttl: str
    where: str = ""  # the block's path in the request, as the API's errors name it: "messages.3.content.1"


def _ordered_blocks(body: dict[str, Any]) -> Iterator[tuple[dict[str, Any], int, str]]:
    """Every cacheable unit in the order the cache sees them (tools, system, messages), framing tokens, its path."""
    for k, tool in enumerate(body.get("tools") or []):
        yield tool, 8, f"tools.{k}"
    for k, block in enumerate(blocks_of(body.get("system"))):
        yield block, 0, f"system.{k}"
    for i, message in enumerate(body["messages"]):
        for k, block in enumerate(blocks_of(message.get("content"))):
            yield block, (4 if k == 0 else 1), f"messages.{i}.content.{k}"


def measure(body: dict[str, Any], ratio: float) -> tuple[int, list[Position]]:
    """Prompt tokens as billed, and each block boundary's prefix (tokens rounded up from our count × `ratio`)."""
    counter = counter_for("o200k_base")
    running = hashlib.blake2b(str(body.get("model")).encode(), digest_size=16)
    total, chain = 0, []
    for block, framing, where in _ordered_blocks(body):
        if not isinstance(block, dict):
            continue
        if "input_schema" in block:  # a tool: counted by its whole definition
            text, fixed = canonical_bytes({k: v for k, v in block.items() if k != "cache_control"}).decode(), 0
        else:
            text, fixed = _block_text(block)
        total += math.ceil((counter.count_text(text) + fixed + framing) * ratio)
        running.update(canonical_bytes({k: v for k, v in block.items() if k != "cache_control"}))
        control = block.get("cache_control")
        ttl = (control.get("ttl") or "5m") if isinstance(control, dict) else ""
        chain.append(Position(running.digest(), total, ttl, where))
    return total + 4, chain


def breakpoints(chain: list[Position]) -> list[int]:
    return [i for i, position in enumerate(chain) if position.ttl]


def ttl_order_problem(chain: list[Position]) -> str | None:
    """Anthropic's 400 for a 1-hour breakpoint after a 5-minute one, in the order the cache reads blocks."""
    short = False
    for position in chain:
        if position.ttl == "1h" and short:
            return (
                f"{position.where}.cache_control.ttl: a ttl='1h' cache_control block must not come after a ttl='5m' "
                "cache_control block. Note that blocks are processed in the following order: `tools`, `system`, "
                "`messages`."
            )
        short = short or position.ttl == "5m"
    return None


def lookup_positions(chain: list[Position]) -> list[Position]:
    """The boundaries a request may read the cache at: each breakpoint and the 20 before it."""
    seen: set[int] = set()
    for b in breakpoints(chain):
        seen.update(range(max(0, b - LOOKBACK_BLOCKS), b + 1))
    return [chain[i] for i in sorted(seen)]


def written(chain: list[Position], read: int, minimum: int) -> tuple[int, int]:
    """Tokens written to the cache for 5 minutes and for 1 hour: the prefix up to the last breakpoint not read."""
    marks = [chain[i] for i in breakpoints(chain) if chain[i].tokens >= minimum]
    if not marks or marks[-1].tokens <= read:
        return 0, 0
    long = max((p.tokens for p in marks if p.ttl == "1h"), default=read)
    hour = max(0, long - read)
    return marks[-1].tokens - read - hour, hour
