"""What the proxy saved, as a user reads it: the line per turn, `/sessions` rows, `/stats`, `context-proxy stats`.

A packaged trace is replayed with the official SDK through `context-proxy serve` (a child process, its log
read as written) to the simulator with an 8k window, so the engine edits and rescues turns that sent direct
would overflow; every view is then checked against `/sessions/{id}`, the numbers the proxy keeps.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio

from proxy import __version__
from proxy.demo.simulator import SimulatorConfig, start_simulator
from proxy.demo.traces import load_trace, requests
from proxy.state.sessions import totals
from proxy.stats_command import usd
from tests.served import ServedProxy, serve

MODEL = "sim-8k"
CONFIG = """
[server]
admin_token_env = "{token_env}"

[upstream]
base_url = "{upstream}"

[models."sim-*"]
context_window = 8000
encoding = "o200k_base"
input_per_mtok = 2.50
cached_input_per_mtok = 1.25

[policy]
reserve_output_tokens = 1000
"""
TURN_LINE = re.compile(
    r"session (\S+) turn (\d+) \((\w+), ([^)]+)\): tokens (\d+) -> (\d+), cached (\d+), epoch (\S+), saved \$(-?[\d.]+)"
)


def write_config(folder: Path, upstream: str, token_env: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "proxy.toml"
    path.write_text(CONFIG.format(upstream=upstream, token_env=token_env))
    return path


@dataclass
class Replayed:
    proxy: ServedProxy
    stats: dict[str, Any]
    rows: list[dict[str, Any]]
    session: dict[str, Any]  # /sessions/dash-1


async def get(url: str, **headers: str) -> Any:
    async with aiohttp.ClientSession() as client, client.get(url, headers=headers) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def replay(root: str, session: str, trace_name: str, turns: int) -> None:
    trace = load_trace(trace_name)
    extra = {"tools": trace.tools} if trace.tools else {}
    async with openai.AsyncOpenAI(base_url=f"{root}/s/{session}/v1", api_key="sk-stats", max_retries=0) as sdk:
        for k, (messages, _answer) in enumerate(requests(trace)):
            if k == turns:
                break
            stream = await sdk.chat.completions.create(model=MODEL, messages=messages, stream=True, **extra)
            assert [chunk async for chunk in stream]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def replayed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Replayed]:
    sim, url = await start_simulator(SimulatorConfig(models={MODEL: 8000}))
    proxy = serve(write_config(tmp_path_factory.mktemp("stats"), url), upstream_url=url)
    try:
        await replay(proxy.root, "dash-1", "sweagent_marshmallow-1867.json", 13)
        await replay(proxy.root, "dash-2", "sweagent_marshmallow-1867.json", 5)
        stats, rows = await get(f"{proxy.root}/stats"), await get(f"{proxy.root}/sessions")
        yield Replayed(proxy, stats, rows, await get(f"{proxy.root}/sessions/dash-1"))
    finally:
        proxy.stop()
        await sim.cleanup()


def test_every_rewritten_turn_logs_one_line_of_what_sessions_shows_for_it(replayed: Replayed) -> None:
    lines = [m.groups() for m in map(TURN_LINE.search, replayed.proxy.log().splitlines()) if m and m[1] == "dash-1"]
    details = replayed.session["turn_details"]

    assert len(lines) == len(details) == 13
    for (_sid, turn, api, model, before, after, cached, epoch, saved), t in zip(lines, details, strict=True):
        assert (int(turn), api, model) == (t["turn"], "chat", MODEL)
        assert (int(before), int(after), int(cached)) == (t["tokens_before"], t["tokens_after"], t["cached_tokens"])
        assert epoch == ("+".join(t["reasons"]) if t["epoch"] else "no")
        assert saved == f"{t['direct_cost_usd'] - t['cost_usd']:.4f}"
    assert any(epoch != "no" for *_, epoch, _saved in lines)


def test_a_session_row_says_what_it_saved_and_what_the_proxy_rescued(replayed: Replayed) -> None:
    session, details = replayed.session, replayed.session["turn_details"]
    row = next(r for r in replayed.rows if r["id"] == "dash-1")

    shared = [k for k in row if k != "conversations"]  # a count in the row, one row each in /sessions/{id}
    assert {k: session[k] for k in shared} == {k: row[k] for k in shared}  # /sessions/{id} is the row and more
    assert (row["api"], row["model"], row["turns"]) == ("chat", MODEL, 13)
    assert row["saved_usd"] == row["direct_cost_usd"] - row["cost_usd"] > 0
    assert row["epochs"] == sum(t["epoch"] for t in details) >= 1
    assert row["overflows_rescued"] == sum(t["over_window"] or t["retried"] for t in details) >= 1
    assert row["tokens_before_total"] == sum(t["tokens_before"] for t in details)
    assert row["tokens_after_total"] == sum(t["tokens_after"] for t in details) < row["tokens_before_total"]
    assert row["billed_tokens"] == sum(t["prompt_tokens"] for t in details)
    assert row["billed_cached_tokens"] == sum(t["cached_tokens"] for t in details) > 0
    assert details[-1]["cumulative_cost_usd"] == pytest.approx(row["cost_usd"])
    assert details[-1]["cumulative_direct_cost_usd"] == pytest.approx(row["direct_cost_usd"])
    assert details[0]["cumulative_cost_usd"] == pytest.approx(details[0]["cost_usd"])


def test_stats_totals_are_the_sessions_rows_added_up(replayed: Replayed) -> None:
    got, rows = replayed.stats["totals"], replayed.rows

    assert replayed.stats["version"] == __version__
    assert got == totals(rows)
    assert got["sessions"] == 2 and got["turns"] == 18
    assert got["saved_usd"] == pytest.approx(sum(r["saved_usd"] for r in rows))
    assert got["cache_hit_rate"] == sum(r["billed_cached_tokens"] for r in rows) / sum(r["billed_tokens"] for r in rows)
    assert got["overflows_rescued"] == sum(r["overflows_rescued"] for r in rows) >= 1


def test_the_stats_command_prints_the_totals_and_a_line_per_session(replayed: Replayed) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "stats", "--url", replayed.proxy.root], capture_output=True, text=True
    )
    t, out = replayed.stats["totals"], done.stdout

    assert done.returncode == 0, done.stderr
    assert f"saved       {usd(t['saved_usd'])} ({t['saved_usd'] / t['direct_cost_usd']:.1%} of direct)" in out
    assert f"billed      {usd(t['cost_usd'])}, direct {usd(t['direct_cost_usd'])}" in out
    assert f"tokens      {t['tokens_before_total']:,} sent by clients -> {t['tokens_after_total']:,} upstream" in out
    assert f"cache hits  {t['cache_hit_rate']:.1%} of billed prompt tokens" in out
    assert f"overflows   {t['overflows_rescued']} rescued" in out
    for row in replayed.rows:
        line = next(line for line in out.splitlines() if line.startswith(row["id"] + " "))
        cells = line.split()
        assert cells[1:8] == [
            "chat", MODEL, str(row["turns"]), usd(row["cost_usd"]), usd(row["direct_cost_usd"]),
            usd(row["saved_usd"]), str(row["epochs"]),
        ]  # fmt: skip


def test_version_prints_the_packages_version() -> None:
    done = subprocess.run([sys.executable, "-m", "proxy", "--version"], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, f"context-proxy {__version__}\n")


@pytest.fixture
def admin_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ServedProxy, Path, str]]:
    """A served proxy whose admin routes need the token in $DASH_TEST_ADMIN_TOKEN."""
    token = "tok-dash-secret-4242"
    monkeypatch.setenv("DASH_TEST_ADMIN_TOKEN", token)
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", token_env="DASH_TEST_ADMIN_TOKEN")
    proxy = serve(config, upstream_url="http://127.0.0.1:9/v1")
    yield proxy, config, token
    proxy.stop()


def test_the_stats_command_sends_the_admin_token_the_config_names(
    admin_proxy: tuple[ServedProxy, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, config, token = admin_proxy
    command = [sys.executable, "-m", "proxy", "stats", "--config", str(config), "--url", proxy.root]

    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "0 sessions, 0 turns" in done.stdout and "(no sessions yet)" in done.stdout

    monkeypatch.delenv("DASH_TEST_ADMIN_TOKEN")
    unset = subprocess.run(command, capture_output=True, text=True)
    assert unset.returncode == 1
    assert unset.stderr.startswith("context-proxy stats: the variable DASH_TEST_ADMIN_TOKEN")

    monkeypatch.setenv("DASH_TEST_ADMIN_TOKEN", "not-the-token")
    wrong = subprocess.run(command, capture_output=True, text=True)
    assert wrong.returncode == 1
    assert "/stats answered 401: This route needs the proxy's admin token." in wrong.stderr
    assert token not in proxy.stop()
