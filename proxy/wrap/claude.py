"""`context-proxy wrap claude [ARGS...]`: Claude Code through the proxy, its exit code passed through.

Claude Code is pointed at the proxy by `ANTHROPIC_BASE_URL` (the proxy's root: Claude Code adds
`/v1/messages` itself); everything else is the user's own: their key (`ANTHROPIC_API_KEY` or
their login), settings and arguments. No session route is needed: the proxy names the session by
the `X-Claude-Code-Session-Id` header Claude Code sends with every request, and keeps its main
thread, subagents and side requests apart as conversations of that session.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.wrap.launch import run_agent

BASE_URL_ENV = "ANTHROPIC_BASE_URL"


def environment(base_url: str) -> dict[str, str]:
    """What the run's environment gets over the user's: the proxy's root (`base_url` without its /v1)."""
    return {BASE_URL_ENV: base_url.rstrip("/").removesuffix("/v1")}


def run(base_url: str, args: Sequence[str]) -> int:
    """Run Claude Code through the proxy at `base_url` (ending in /v1) and return its exit code."""
    return run_agent("claude", "@anthropic-ai/claude-code", lambda binary: [binary, *args], environment(base_url))
