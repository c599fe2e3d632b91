"""The real Claude Code (npm `@anthropic-ai/claude-code`, pinned in scripts/install_agents.sh), headless on loopback.

`run_claude` runs `claude -p PROMPT --output-format json` with a HOME and config folder of its own,
a dummy API key and ANTHROPIC_BASE_URL at one base URL (the scripted upstream, or the proxy in
front of it), everything that would reach elsewhere turned off (update checks, telemetry, error
reports, the other nonessential traffic), and every tool allowed (IS_SANDBOX lets root skip the
permission prompts). It runs under strace (agent_cli.run_traced), so a test can prove it reached
nothing but 127.0.0.1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from proxy.config.loader import packaged_models
from proxy.context.policy import ModelInfo
from tests.agents.agent_cli import TIMEOUT_S, agent_binary, run_traced

CLAUDE_VERSION = "2.1.332"
DEFAULT_MODEL = "claude-opus-5-5"  # what 2.1.332 asks for when no --model is given
# What keeps Claude Code offline and quiet, beside the base URL and the key.
QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "IS_SANDBOX": "1",
    "NO_COLOR": "1",
    "TERM": "dumb",
}


def claude_rows(window: int) -> tuple[ModelInfo, ...]:
    """The packaged model table, every Claude row's window set to `window` (prices as shipped)."""
    return tuple(replace(m, context_window=window) if m.pattern.startswith("claude") else m for m in packaged_models())


def claude_binary() -> Path:
    return agent_binary("claude")


def claude_env(home: Path, base_url: str | None = None) -> dict[str, str]:
    """The environment of a run: its own HOME and config folder, a dummy key, `QUIET`, the base URL if given."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_API_KEY": "sk-ant-claude-code-test",
        **QUIET,
    }
    if base_url is not None:
        env["ANTHROPIC_BASE_URL"] = base_url
    return env


@dataclass
class ClaudeRun:
    returncode: int
    result: dict[str, Any]  # the --output-format json document ({} when it printed none)
    stderr: str
    addresses: set[str]  # every IPv4/IPv6 address it connected or sent to (DNS included)

    @property
    def answer(self) -> str:
        return str(self.result.get("result", ""))


def print_args(prompt: str, model: str | None = None) -> list[str]:
    """`-p PROMPT --output-format json`, every tool allowed, and `--model` when given."""
    args = ["-p", prompt, "--output-format", "json", "--dangerously-skip-permissions"]
    return args + (["--model", model] if model else [])


async def run_claude(
    base_url: str, prompt: str, home: Path, workdir: Path, model: str | None = None, timeout_s: float = TIMEOUT_S
) -> ClaudeRun:
    """`claude -p PROMPT --output-format json` against `base_url` (the root, no /v1), in `workdir`."""
    home.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    command = [str(claude_binary()), *print_args(prompt, model)]
    done = await run_traced(command, claude_env(home, base_url), workdir, home / "connects.strace", timeout_s)
    try:
        result = orjson.loads(done.stdout)
    except orjson.JSONDecodeError:
        result = {}
    return ClaudeRun(done.returncode, result if isinstance(result, dict) else {}, done.stderr, done.addresses)
