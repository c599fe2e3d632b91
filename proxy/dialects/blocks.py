"""Anthropic Messages content blocks as the engine reads them: the blocks of a content, the text they are counted
by, and the tokens their images and PDFs are billed (`proxy.dialects.messages` maps messages with them,
`proxy.dialects.breakpoints` finds and places marks in them), and whether a body has the shape they are read in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.tokens.media import anthropic_block_tokens

TOOL_RESULT, TOOL_USE = "tool_result", "tool_use"


def content_blocks(content: Any) -> list[Any]:
    """A message's content (a system prompt's, a tool result's) as a list of blocks: a string is one text block."""
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])


def blocks_text(blocks: Sequence[Any]) -> str:
    """What a run of blocks is counted by: text as it is, an image or a PDF as a marker (`media_tokens` counts it),
    anything else as its JSON."""
    out = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            out.append(str(block.get("text", "")))
        elif kind == "thinking":
            out.append(str(block.get("thinking", "")))
        elif kind == TOOL_RESULT:
            content = block.get("content")
            out.append(blocks_text(content_blocks(content)) if isinstance(content, str | list) else "")
        elif kind == "image":
            out.append("[image]")
        elif kind == "document":
            out.append(_document_text(block))
        elif kind != TOOL_USE:
            out.append(orjson.dumps(block).decode())
    return "\n".join(out)


def _document_text(block: Mapping[str, Any]) -> str:
    """A document's title and context, and its text when it is text (a plain-text source, or content blocks)."""
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    words = [str(block[key]) for key in ("title", "context") if isinstance(block.get(key), str)]
    if source.get("type") == "text":
        words.append(str(source.get("data", "")))
    elif source.get("type") == "content" and isinstance(source.get("content"), str | list):
        words.append(blocks_text([b for b in content_blocks(source["content"]) if isinstance(b, dict)]))
    else:
        words.append("[document]")
    return "\n".join(words)


def media_tokens(blocks: Sequence[Any]) -> int:
    """The tokens of the images and PDFs in a run of blocks (a tool_result's own included), as Anthropic bills
    them (`proxy.tokens.media`)."""
    total = 0
    for block in blocks:
        if block.get("type") == TOOL_RESULT and isinstance(block.get("content"), list):
            total += media_tokens([b for b in block["content"] if isinstance(b, dict)])
        else:
            total += anthropic_block_tokens(block)
    return total


def _is_blocks(content: Any) -> bool:
    if isinstance(content, str):
        return True
    if not isinstance(content, list):
        return False
    # A loop, not all() over a generator (SIM110): it runs for every block of every message every turn, and the
    # generator doubles its cost (454 -> 230 us on a 200k-token body, timeit).
    for block in content:  # noqa: SIM110
        if not (isinstance(block, dict) and isinstance(block.get("type"), str)):
            return False
    return True


def unmodelled(body: Mapping[str, Any]) -> str | None:
    """Where the body has a shape this adapter does not map (the request then goes as sent), or None."""
    if not isinstance(body.get("model"), str):
        return "model"
    messages = body.get("messages")
    if not isinstance(messages, list):
        return "messages"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return f"messages.{i}"
        if not _is_blocks(message.get("content")):
            return f"messages.{i}.content"
    system = body.get("system")
    if system is not None and not _is_blocks(system):
        return "system"
    return None
