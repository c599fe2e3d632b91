"""What every real agent CLI run shares: the pinned binary, a loopback server for it, strace, the exit.

The binaries are npm's (pinned in scripts/install_agents.sh). `run_traced` runs one under strace
(Debian's package, which .ci/run installs) so that every connect and DNS query it makes is
recorded, and a test can prove it reached nothing but 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 90
_INET = re.compile(r'inet_addr\("([0-9.]+)"\)|inet_pton\(AF_INET6, "([^"]+)"')


def agent_binary(name: str) -> Path:
    """The pinned `name` (claude, codex): `AGENTS_BIN` or scripts/install_agents.sh's folder; never skipped."""
    folder = Path(os.environ.get("AGENTS_BIN") or REPO / ".cache" / "agents" / "node_modules" / ".bin")
    binary = folder / name
    assert binary.exists(), f"{binary} is missing: run scripts/install_agents.sh (.ci/run does)"
    return binary


async def serve_local(app: web.Application) -> tuple[web.AppRunner, str]:
    """`app` on an ephemeral port of 127.0.0.1: its runner and its root URL (no /v1)."""
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@dataclass
class Traced:
    """An agent's exit: its code, what it printed, and every address it connected or sent to (DNS included)."""

    returncode: int
    stdout: str
    stderr: str
    addresses: set[str]


async def run_traced(
    command: Sequence[str], env: Mapping[str, str], cwd: Path, trace: Path, timeout_s: float = TIMEOUT_S
) -> Traced:
    """`command` under strace in `cwd` with exactly `env`, killed past `timeout_s` (TimeoutError)."""
    strace = shutil.which("strace")
    assert strace, "strace is missing (apt-get install strace; .ci/run does): the loopback check needs it"
    traced = [strace, "-f", "-qq", "-e", "trace=connect,sendto,sendmmsg", "-o", str(trace), *command]
    process = await asyncio.create_subprocess_exec(
        *traced, cwd=cwd, env=dict(env), start_new_session=True,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        os.killpg(process.pid, signal.SIGKILL)  # the agent too, not strace alone (its tracees outlive it)
        await process.wait()
        raise
    assert process.returncode is not None
    out, err = stdout.decode(errors="replace"), stderr.decode(errors="replace")
    return Traced(process.returncode, out, err, _addresses(trace))


def _addresses(trace: Path) -> set[str]:
    found: set[str] = set()
    for line in trace.read_text().splitlines() if trace.exists() else ():
        for v4, v6 in _INET.findall(line):
            found.add(v4 or v6)
    return found


async def run_wrap(args: Sequence[str], env: Mapping[str, str], cwd: Path, proxy_url: str | None = None) -> Traced:
    """`python -m proxy wrap ARGS` as a user runs it from `cwd`: the agent on PATH in `env`, this checkout importable,
    `CONTEXT_PROXY_URL` set when `proxy_url` is given."""
    env = {**env, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    if proxy_url is not None:
        env["CONTEXT_PROXY_URL"] = proxy_url
    cwd.mkdir(parents=True, exist_ok=True)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "wrap", *args, cwd=cwd, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    assert process.returncode is not None
    return Traced(process.returncode, out.decode(errors="replace"), err.decode(errors="replace"), set())
