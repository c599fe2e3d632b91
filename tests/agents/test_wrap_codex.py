"""`context-proxy wrap codex [ARGS...]` with the real Codex CLI: the proxy already running, or one it starts.

Codex reads the user's own config (here a CODEX_HOME holding the loopback-only settings); wrap adds
only the provider that points it at the proxy, and gives back Codex's exit code.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.agents.agent_cli import run_wrap, serve_local
from tests.agents.codex_cli import codex_binary, write_quiet_config
from tests.agents.responses_upstream import FINAL_PREFIX, ScriptedResponses
from tests.conftest import MakeRig

COMMANDS = ("seq 1 50", "echo wrapped")


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[ScriptedResponses, str]]:
    scripted = ScriptedResponses(COMMANDS)
    runner, root = await serve_local(scripted.app())
    yield scripted, root + "/v1"
    await runner.cleanup()


async def wrap(tmp_path: Path, *args: str, proxy_url: str | None = None) -> tuple[int, str, str]:
    """`python -m proxy wrap ...` as a user runs it: codex on PATH, their own CODEX_HOME, an OpenAI key."""
    home = tmp_path / "codex-home"
    write_quiet_config(home)
    env = {
        "PATH": f"{codex_binary().parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "OPENAI_API_KEY": "sk-wrapped",
    }
    done = await run_wrap(args, env, tmp_path / "work", proxy_url)
    return done.returncode, done.stdout, done.stderr


def exec_args(tmp_path: Path) -> list[str]:
    last = tmp_path / "last.txt"
    return ["codex", "exec", "--skip-git-repo-check", "--ephemeral", "-s", "danger-full-access", "-o", str(last), "Go."]


async def test_wrap_codex_runs_through_the_proxy_already_running(
    upstream: tuple[ScriptedResponses, str], make_rig: MakeRig, tmp_path: Path
) -> None:
    scripted, url = upstream
    rig = await make_rig(upstream_url=url, engine=True)
    code, _, err = await wrap(tmp_path, *exec_args(tmp_path), proxy_url=rig.root)
    assert code == 0, err[-2000:]
    assert (tmp_path / "last.txt").read_text().startswith(FINAL_PREFIX)
    rows = await rig.context.sessions_json()
    assert [row["id"] for row in rows] == [scripted.received[-1].headers["session-id"]]
    assert rows[0]["turns"] == len(scripted.received) == len(COMMANDS) + 1
    assert scripted.upgrades == 0  # HTTP mode: where the proxy can fit the window


async def test_wrap_codex_starts_a_proxy_when_none_runs_and_passes_the_exit_code_through(
    upstream: tuple[ScriptedResponses, str], tmp_path: Path
) -> None:
    scripted, url = upstream
    code, _, err = await wrap(tmp_path, "--upstream", url, *exec_args(tmp_path))
    assert code == 0, err[-2000:]
    assert (tmp_path / "last.txt").read_text().startswith(FINAL_PREFIX)
    assert {r.headers.get("Accept-Encoding") for r in scripted.received} == {"identity"}  # the proxy's, not Codex's
    code, _, err = await wrap(tmp_path, "--upstream", url, "codex", "exec", "--no-such-flag")
    assert code == 2 and "--no-such-flag" in err  # Codex's own usage error, its own exit code
