"""API dialects: one adapter per API between its requests and the one context engine (SPEC §7)."""

from proxy.dialects.base import Conversation, Dialect, Usage, group_digest, opaque
from proxy.dialects.chat import CHAT
from proxy.dialects.messages import MESSAGES
from proxy.dialects.responses import RESPONSES

# Every API whose requests the engine rewrites: `POST /v1/{upstream_path}` (and under `/s/{id}`) per entry.
DIALECTS: tuple[Dialect, ...] = (CHAT, RESPONSES, MESSAGES)

__all__ = [
    "CHAT", "DIALECTS", "MESSAGES", "RESPONSES", "Conversation", "Dialect", "Usage", "group_digest", "opaque",
]  # fmt: skip
