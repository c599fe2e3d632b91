"""Responses input items in the groups the engine keeps whole, and each group's JSON (`proxy.dialects.responses`
maps each group to one engine message). A body that continues a recent conversation takes that conversation's
groups while their items are the very objects the body memo reused (`proxy.service.body_memos`)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.dialects.base import Conversation, kept_json


@dataclass(frozen=True, slots=True)
class Group:
    """What one engine message was made from: `instructions`, the `input` string, or input items."""

    kind: str  # "instructions" | "text" | "items"
    items: tuple[Any, ...]
    editable: int = -1  # the item an edit of the engine message is written into (-1: none)


def item_type(item: Mapping[str, Any]) -> str:
    kind = item.get("type")
    return kind if isinstance(kind, str) else "message" if "role" in item else ""


def is_call(item: Mapping[str, Any]) -> bool:
    return item_type(item).endswith("_call") and isinstance(item.get("call_id"), str)


def is_output(item: Mapping[str, Any]) -> bool:
    return item_type(item).endswith("_call_output") and isinstance(item.get("call_id"), str)


def grouped(items: Sequence[Mapping[str, Any]]) -> list[Group]:
    """Input items in the groups the engine must keep whole (a reasoning item leads the output it preceded)."""
    groups: list[Group] = []
    lead: list[Any] = []
    i = 0
    while i < len(items):
        item = items[i]
        kind = item_type(item)
        if kind == "reasoning":
            lead.append(item)
            i += 1
            continue
        assistant = kind == "message" and item.get("role") == "assistant"
        end = i + 1 if assistant else i  # an assistant's text and the calls right after it are one turn
        while end < len(items) and is_call(items[end]):
            end += 1
        if end > i + assistant:
            groups.append(Group("items", (*lead, *items[i:end])))
            lead, i = [], end
            continue
        if lead and not assistant:  # reasoning that precedes no output of its own stays alone
            groups.append(Group("items", tuple(lead)))
            lead = []
        editable = (kind == "message" and not lead) or is_output(item)
        groups.append(Group("items", (*lead, item), len(lead) if editable else -1))
        lead, i = [], i + 1
    if lead:
        groups.append(Group("items", tuple(lead)))
    return groups


def _group_json(group: Group, keys: Sequence[bytes]) -> bytes:
    """`kept_json([group.kind, group.editable, *group.items])` from its items' own JSON (`keys`, the body memo's):
    orjson writes a list as its items' bytes between `[`, `,` and `]`, so no item is dumped again."""
    return b"".join((b'["', group.kind.encode(), b'",', str(group.editable).encode(), b",", b",".join(keys), b"]"))


def groups_json(groups: Sequence[Group], keys: Sequence[bytes] | None) -> list[bytes]:
    """Each group's JSON; from the items' keys where the body memo made them (`keys`: one per input item)."""
    made, at = [], 0
    for group in groups:
        if keys is None or group.kind != "items":
            made.append(kept_json([group.kind, group.editable, *group.items]))
            continue
        made.append(_group_json(group, keys[at : at + len(group.items)]))
        at += len(group.items)
    return made


def grouped_before(items: Sequence[Any], previous: Sequence[Conversation]) -> tuple[list[Group], list[bytes]]:
    """The leading item groups of a conversation this body may continue whose items are these very objects (the body
    memo's), with each one's JSON: `grouped` would make them again, since it decides where a group ends by the item
    after it, and that item is the same object too. The most such groups of any of `previous`."""
    best: tuple[list[Group], list[bytes]] = ([], [])
    for conversation in previous:
        pairs = [
            (group, made)
            for group, made in zip(conversation.groups, conversation.made_from, strict=False)
            if isinstance(group, Group) and group.kind == "items"
        ]
        at, count = 0, 0
        for (group, _), (after, _) in itertools.pairwise(pairs):
            end = at + len(group.items)
            if end >= len(items) or items[end] is not after.items[0]:
                break
            if any(mine is not theirs for mine, theirs in zip(items[at:end], group.items, strict=True)):
                break
            at, count = end, count + 1
        if count > len(best[0]):
            best = [group for group, _ in pairs[:count]], [made for _, made in pairs[:count]]
    return best
