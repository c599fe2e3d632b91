"""The real Codex CLI (npm `@openai/codex`, pinned in scripts/install_agents.sh), run headless on loopback.

`run_codex` gives it a fresh CODEX_HOME whose config points it at one base URL (the scripted
upstream, or the proxy in front of it) and turns off everything that would reach elsewhere:
update checks, analytics, the plugin sync (github.com, chatgpt.com); it runs under strace
(agent_cli.run_traced), so a test can prove it reached nothing but 127.0.0.1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from proxy.wrap.codex import provider_overrides
from tests.agents.agent_cli import agent_binary, run_traced

CODEX_VERSION = "0.171.0"
# What the test config adds to the provider `proxy.wrap.codex` names: no OpenAI auth, WebSocket mode tried
# first (the upstream refuses it, as a server without it does), Codex's own compaction out of the way.
QUIET = {
    "model": '"gpt-5.1-codex"',
    "check_for_update_on_startup": "false",
    "analytics.enabled": "false",
    "features.plugins": "false",
    "features.remote_plugin": "false",
    "features.apps": "false",
    "model_context_window": "1000000",
    "model_auto_compact_token_limit": "900000",
}
KEY_ENV = "CONTEXT_PROXY_TEST_KEY"


def codex_binary() -> Path:
    return agent_binary("codex")


@dataclass
class CodexRun:
    returncode: int
    last_message: str
    stderr: str
    addresses: set[str]  # every IPv4/IPv6 address it connected or sent to (DNS included)


def write_quiet_config(home: Path) -> None:
    """A CODEX_HOME/config.toml holding `QUIET` (what a user's own config would hold, for `wrap codex`)."""
    home.mkdir(parents=True, exist_ok=True)
    tables: dict[str, list[str]] = {"": []}
    for key, value in QUIET.items():
        table, _, name = key.rpartition(".")
        tables.setdefault(table, []).append(f"{name} = {value}")
    text = "\n".join(tables.pop(""))
    text += "".join(f"\n[{table}]\n" + "\n".join(lines) for table, lines in tables.items())
    (home / "config.toml").write_text(text + "\n")


def _config_args(base_url: str) -> list[str]:
    args = provider_overrides(base_url, env_key=KEY_ENV, websockets=True)
    for key, value in QUIET.items():
        args += ["-c", f"{key}={value}"]
    return args


async def run_codex(base_url: str, prompt: str, home: Path, workdir: Path) -> CodexRun:
    """`codex exec PROMPT` against `base_url`, in `workdir`, with a CODEX_HOME of its own."""
    home.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    last = home / "last-message.txt"
    command = [str(codex_binary()), *_config_args(base_url), "exec", "--strict-config", "--skip-git-repo-check"]
    command += ["--ephemeral", "-s", "danger-full-access", "-o", str(last), prompt]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CODEX_HOME": str(home),
        KEY_ENV: "sk-codex-test",
        "NO_COLOR": "1",
        "TERM": "dumb",
    }
    done = await run_traced(command, env, workdir, home / "connects.strace")
    text = last.read_text() if last.exists() else ""
    return CodexRun(done.returncode, text.strip(), done.stderr, done.addresses)
