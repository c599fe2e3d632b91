"""API dialects: one adapter per API between its requests and the one context engine (SPEC §7)."""

from proxy.dialects.base import Conversation, Dialect, Usage, group_digest, opaque
from proxy.dialects.chat import CHAT

# Every API whose requests the engine rewrites: `POST /v1/{upstream_path}` (and under `/s/{id}`) per entry.
DIALECTS: tuple[Dialect, ...] = (CHAT,)

__all__ = ["CHAT", "DIALECTS", "Conversation", "Dialect", "Usage", "group_digest", "opaque"]
