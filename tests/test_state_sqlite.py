"""The SQLite state file never holds traffic back, never loses a turn, refuses to start unwritable, stays bounded.

A real lock from another process (`BEGIN EXCLUSIVE` held by a child Python), a real immutable file
(`chattr +i`), and the proxy's own `context-proxy serve` for the start-up check.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.harness import chat_body, closed_port, settle, start_rig

# Holds an exclusive lock on the file until its stdin closes; says "locked" once it has it.
_LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
db.execute("ROLLBACK")
"""


async def _health(client: aiohttp.ClientSession, port: int) -> dict:
    async with client.get(f"http://127.0.0.1:{port}/healthz") as response:
        return await response.json()


def _stored_sessions(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as db:
        return {sid.split("@")[0]: turns for sid, turns in db.execute("SELECT id, turn_count FROM sessions")}


async def test_a_locked_state_file_delays_no_turn_and_loses_none(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    rig = await start_rig(engine=True, state={"path": str(path)})
    locker = subprocess.Popen([sys.executable, "-c", _LOCKER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == b"locked"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client:
            for n in range(4):
                body = chat_body(f"task {n}")
                url = f"{rig.base_url}/chat/completions"
                async with client.post(url, json=body, headers={"X-Session-Id": f"s{n}"}) as response:
                    assert response.status == 200, await response.text()
            assert await settle(lambda: rig.context.store.problem is not None, timeout=10)
            health = await _health(client, rig.port)
            assert health["status"] == "ok" and health["state"] == "degraded"
            assert "state.sqlite" in health["state_error"] and "locked" in health["state_error"]
            assert locker.poll() is None, "the lock was held throughout"

            locker.communicate(b"", timeout=10)  # the lock goes away
            assert await settle(lambda: rig.context.store.pending == 0, timeout=10)
            assert (await _health(client, rig.port))["state"] == "ok"
        assert _stored_sessions(path) == {"s0": 1, "s1": 1, "s2": 1, "s3": 1}
    finally:
        if locker.poll() is None:
            locker.kill()
        await rig.close()


def test_an_unwritable_state_file_stops_the_start_with_one_line(tmp_path: Path) -> None:
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    path = tmp_path / "state.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()
    config = tmp_path / "proxy.toml"
    config.write_text(f'[state]\npath = "{path}"\n')
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("this file system does not take chattr +i")
    try:
        run = subprocess.run(
            [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(closed_port())],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "readonly" in lines[0], run.stderr


async def test_the_state_file_keeps_at_most_max_sessions_least_recent_out_first(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    rig = await start_rig(engine=True, state={"path": str(path), "max_sessions": 5})
    try:
        async with aiohttp.ClientSession() as client:
            for n in range(12):
                url = f"{rig.base_url}/chat/completions"
                async with client.post(url, json=chat_body(f"task {n}"), headers={"X-Session-Id": f"s{n}"}) as r:
                    assert r.status == 200
        assert await settle(lambda: rig.context.store.pending == 0, timeout=10)
    finally:
        await rig.close()
    assert sorted(_stored_sessions(path)) == sorted(f"s{n}" for n in range(7, 12))
