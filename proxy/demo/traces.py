"""The packaged agent traces, and the requests their agents sent, turn by turn.

A trace file holds one conversation's final history; the agent's k-th request was
`messages[:i]` for the k-th assistant message at index i (see data/traces/README.md).
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

Message = dict[str, Any]

_PACKAGE = "proxy"
_FOLDER = "data/traces"


@dataclass(frozen=True)
class Trace:
    """One agent run: where it came from, the tools it offered and its whole history."""

    name: str
    source: str
    tools: list[dict[str, Any]] | None
    messages: list[Message]
    format: str = ""

    @property
    def turns(self) -> int:
        return sum(1 for _ in requests(self))


def _folder() -> Any:
    return importlib.resources.files(_PACKAGE).joinpath(_FOLDER)


def list_traces() -> list[str]:
    """File names of the packaged traces, sorted."""
    return sorted(p.name for p in _folder().iterdir() if p.name.endswith(".json"))


def _packaged_name(name: str) -> str | None:
    """A packaged trace by file name, by name without `.json`, or by a unique part of its name."""
    names = list_traces()
    for candidate in (name, f"{name}.json"):
        if candidate in names:
            return candidate
    matches = [n for n in names if name in n]
    return matches[0] if len(matches) == 1 else None


def load_trace(name_or_path: str | Path) -> Trace:
    """Load a packaged trace (`mini_django-11138.tools.json`, or `mini_django`) or a trace file."""
    packaged = _packaged_name(str(name_or_path))
    if packaged is not None:
        data, name = _folder().joinpath(packaged).read_bytes(), packaged
    elif Path(name_or_path).is_file():
        data, name = Path(name_or_path).read_bytes(), Path(name_or_path).name
    else:
        raise ValueError(f"no single trace matches {str(name_or_path)!r}; packaged traces: {', '.join(list_traces())}")
    doc = orjson.loads(data)
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        raise ValueError(f"{name}: a trace is an object with a `messages` list")
    return Trace(
        name=name,
        source=str(doc.get("source", "")),
        tools=doc.get("tools") or None,
        messages=doc["messages"],
        format=str(doc.get("format", "")),
    )


def message_text(content: Any) -> str:
    """A trace message's content as one text (its parts' texts joined), for converting it to another API."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def requests(trace: Trace) -> Iterator[tuple[list[Message], Message]]:
    """Each request the agent sent (a fresh list; the messages are shared) and the answer it got."""
    for i, message in enumerate(trace.messages):
        if message.get("role") == "assistant" and i > 0:
            yield trace.messages[:i], message
