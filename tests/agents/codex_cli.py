"""The real Codex CLI (npm `@openai/codex`, pinned in scripts/install_agents.sh), run headless on loopback.

`run_codex` gives it a fresh CODEX_HOME whose config points it at one base URL (the scripted
upstream, or the proxy in front of it) and turns off everything that would reach elsewhere:
update checks, analytics, the plugin sync (github.com, chatgpt.com). Under strace (Debian's
package, which .ci/run installs) every connect and DNS query it makes is recorded, so a test
can prove it reached nothing but 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from proxy.wrap.codex import provider_overrides

REPO = Path(__file__).resolve().parents[2]
CODEX_VERSION = "0.171.0"
TIMEOUT_S = 60
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
_INET = re.compile(r'inet_addr\("([0-9.]+)"\)|inet_pton\(AF_INET6, "([^"]+)"')


def codex_binary() -> Path:
    """The pinned binary: `AGENTS_BIN` or scripts/install_agents.sh's folder; never skipped when absent."""
    folder = Path(os.environ.get("AGENTS_BIN") or REPO / ".cache" / "agents" / "node_modules" / ".bin")
    binary = folder / "codex"
    assert binary.exists(), f"{binary} is missing: run scripts/install_agents.sh (.ci/run does)"
    return binary


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
    trace = home / "connects.strace"
    command = [str(codex_binary()), *_config_args(base_url), "exec", "--strict-config", "--skip-git-repo-check"]
    command += ["--ephemeral", "-s", "danger-full-access", "-o", str(last), prompt]
    strace = shutil.which("strace")
    assert strace, "strace is missing (apt-get install strace; .ci/run does): the loopback check needs it"
    command = [strace, "-f", "-qq", "-e", "trace=connect,sendto,sendmmsg", "-o", str(trace), *command]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CODEX_HOME": str(home),
        KEY_ENV: "sk-codex-test",
        "NO_COLOR": "1",
        "TERM": "dumb",
    }
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=workdir,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    text = last.read_text() if last.exists() else ""
    return CodexRun(process.returncode, text.strip(), stderr.decode(errors="replace"), _addresses(trace))


def _addresses(trace: Path) -> set[str]:
    found: set[str] = set()
    for line in trace.read_text().splitlines() if trace.exists() else ():
        for v4, v6 in _INET.findall(line):
            found.add(v4 or v6)
    return found
