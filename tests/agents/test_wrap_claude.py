"""`context-proxy wrap claude [ARGS...]` with the real Claude Code: the proxy already running, or one it starts.

The user's environment holds their key and Claude Code's own settings (here the loopback-only ones
of claude_cli.py) and no base URL; wrap adds only ANTHROPIC_BASE_URL, and gives back Claude Code's
exit code.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from tests.agents.agent_cli import run_wrap, serve_local
from tests.agents.claude_cli import claude_binary, claude_env, print_args
from tests.agents.messages_upstream import FINAL_PREFIX, ScriptedMessages
from tests.conftest import MakeRig

COMMANDS = ("seq 1 50", "echo wrapped")


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[ScriptedMessages, str]]:
    scripted = ScriptedMessages(COMMANDS)
    runner, root = await serve_local(scripted.app())
    yield scripted, root
    await runner.cleanup()


async def wrap(tmp_path: Path, *args: str, proxy_url: str | None = None) -> tuple[int, str, str]:
    """`python -m proxy wrap ...` as a user runs it: claude on PATH, their own HOME and key, no base URL."""
    env = claude_env(tmp_path / "claude-home")
    env["PATH"] = f"{claude_binary().parent}{os.pathsep}{env['PATH']}"
    done = await run_wrap(args, env, tmp_path / "work", proxy_url)
    return done.returncode, done.stdout, done.stderr


def answer(stdout: str) -> str:
    return str(orjson.loads(stdout).get("result", ""))


async def test_wrap_claude_runs_through_the_proxy_already_running(
    upstream: tuple[ScriptedMessages, str], make_rig: MakeRig, tmp_path: Path
) -> None:
    scripted, root = upstream
    rig = await make_rig(upstream_url=root + "/v1", engine=True)
    code, out, err = await wrap(tmp_path, "claude", *print_args("Go."), proxy_url=rig.root)
    assert code == 0, err[-2000:]
    assert answer(out).startswith(FINAL_PREFIX)
    rows = await rig.context.sessions_json()
    assert [row["id"] for row in rows] == [scripted.received[-1].headers["X-Claude-Code-Session-Id"]]
    assert rows[0]["turns"] == len(scripted.received) == len(COMMANDS) + 1


async def test_wrap_claude_starts_a_proxy_when_none_runs_and_passes_the_exit_code_through(
    upstream: tuple[ScriptedMessages, str], tmp_path: Path
) -> None:
    scripted, root = upstream
    code, out, err = await wrap(tmp_path, "--anthropic-upstream", root, "claude", *print_args("Go."))
    assert code == 0, err[-2000:]
    assert answer(out).startswith(FINAL_PREFIX)
    assert {r.headers.get("Accept-Encoding") for r in scripted.received} == {"identity"}  # the proxy's, not Claude's
    code, _, err = await wrap(tmp_path, "--anthropic-upstream", root, "claude", "--no-such-flag")
    assert code == 1 and "--no-such-flag" in err  # Claude Code's own usage error, its own exit code
