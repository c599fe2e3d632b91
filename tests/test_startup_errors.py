"""Every usual start-up mistake is one line on stderr naming the thing, and a non-zero exit, with no traceback.

Each case runs `python -m proxy serve` as a user would, on a copy of the packaged config with one mistake.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.cli import check_startup
from proxy.config.loader import DEFAULT_CONFIG, ConfigError, ConfigHolder, load_settings

# (what to write, file, old text, new text, what the one line must say)
CONFIG_MISTAKES = [
    pytest.param(
        "sessions/x.toml", None, 'matches = ["a"]\n', r"x\.toml:1: matches: unknown key; did you mean 'match'\?",
        id="session-key-typo",
    ),
    pytest.param(
        "sessions/x.toml", None, 'match = ["a"]\n\n[polcy]\nkeep_tokens = 1\n',
        r"x\.toml:3: \[polcy\]: unknown section; did you mean \[policy\]\?", id="session-section-typo",
    ),
    pytest.param(
        "sessions/x.toml", None, 'match = ["a"]\n[policy]\nsoft_budget_token = 1\n',
        r"x\.toml:3: \[policy\] soft_budget_token: unknown key; did you mean 'soft_budget_tokens'\?",
        id="policy-key-typo",
    ),
    pytest.param(
        "sessions/x.toml", None, 'match = ["a"]\n[policy]\nreserve_output_tokens = "4096"\n',
        r"x\.toml:3: \[policy\] reserve_output_tokens: should be a valid integer, not '4096'", id="string-for-int",
    ),
    pytest.param(
        "sessions/x.toml", None, 'match = ["a"]\n[policy.clear_tool_outputs]\nobservation_patterns = ["(open"]\n',
        r"x\.toml:3: \[policy\.clear_tool_outputs\] observation_patterns: the pattern '\(open'",
        id="bad-regex",
    ),
    pytest.param(
        "sessions/x.toml", None, "[policy]\ndedup = false\n",
        r"x\.toml: match: required: the session ids or globs", id="session-without-match",
    ),
    pytest.param(
        "proxy.toml", "max_body_mb = 32", 'max_body_mb = "32"',
        r"proxy\.toml:11: \[server\] max_body_mb: should be a valid number, not '32'", id="string-for-number",
    ),
    pytest.param(
        "proxy.toml", "port = 8787", "port = 99999",
        r"proxy\.toml:10: \[server\] port: should be less than or equal to 65535, not 99999", id="port-out-of-range",
    ),
    pytest.param(
        "proxy.toml", "[auth]", "[auht]", r"proxy\.toml:\d+: \[auht\]: unknown section; did you mean \[auth\]\?",
        id="unknown-section",
    ),
    pytest.param(
        "proxy.toml", "low_water = 0.60", "low_water = 1.5",
        r"proxy\.toml:\d+: \[policy\] low_water: should be less than or equal to 1, not 1\.5", id="share-above-one",
    ),
    pytest.param(
        "proxy.toml", 'base_url = "https://', 'base_url = "',  # the first is [upstream]'s: its scheme dropped
        r"proxy\.toml:\d+: \[upstream\] base_url: should be an http:// or https:// URL", id="url-without-scheme",
    ),
    pytest.param(
        "proxy.toml", 'api_key_env = ""', 'api_key_env = "CONTEXT_PROXY_TEST_UNSET_KEY"',
        r"proxy\.toml:\d+: \[upstream\] api_key_env: the variable CONTEXT_PROXY_TEST_UNSET_KEY is not set",
        id="unset-key-variable",
    ),
    pytest.param(
        "proxy.toml", 'api_key_env = ""              # set: the proxy sends $VAR\'s key as x-api-key',
        'api_key_env = "CONTEXT_PROXY_TEST_UNSET_KEY"  # the x-api-key',
        r"proxy\.toml:\d+: \[anthropic\] api_key_env: the variable CONTEXT_PROXY_TEST_UNSET_KEY is not set",
        id="unset-anthropic-key-variable",
    ),
]  # fmt: skip


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    shutil.copytree(DEFAULT_CONFIG.parent, tmp_path / "config")
    return tmp_path / "config"


def write_mistake(config_dir: Path, name: str, old: str | None, new: str) -> None:
    path = config_dir / name
    if old is None:
        path.write_text(new)
        return
    text = path.read_text()
    assert old in text, f"the packaged {name} no longer holds {old!r}"
    path.write_text(text.replace(old, new, 1))


def serve(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m proxy serve ARGS` until it exits (each mistake stops it before it listens)."""
    env = {k: v for k, v in os.environ.items() if k != "CONTEXT_PROXY_TEST_UNSET_KEY"}
    command = [sys.executable, "-m", "proxy", "serve", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def assert_one_line(done: subprocess.CompletedProcess[str], pattern: str, code: int) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert re.search(pattern, lines[0]), lines[0]


@pytest.mark.parametrize(("name", "old", "new", "pattern"), CONFIG_MISTAKES)
def test_a_config_mistake_names_file_line_and_key(
    config_dir: Path, name: str, old: str | None, new: str, pattern: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONTEXT_PROXY_TEST_UNSET_KEY", raising=False)
    write_mistake(config_dir, name, old, new)
    with pytest.raises(ConfigError) as refused:
        check_startup(load_settings(config_dir / "proxy.toml"))
    assert "\n" not in str(refused.value) and re.search(pattern, str(refused.value)), refused.value


@pytest.mark.parametrize(("name", "old", "new", "pattern"), [CONFIG_MISTAKES[i] for i in (1, 3, 6, 11)])
def test_serve_stops_on_a_config_mistake_with_that_one_line(
    config_dir: Path, name: str, old: str | None, new: str, pattern: str
) -> None:
    write_mistake(config_dir, name, old, new)
    assert_one_line(serve("--config", str(config_dir / "proxy.toml"), cwd=config_dir), pattern, 2)


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["--port", "99999"], r"--port: should be less than or equal to 65535, not 99999"),
        (["--port", "http"], r"--port: should be an integer from 0 to 65535, not 'http'"),
        (["--upstream", "localhost:9000/v1"], r"--upstream: should be an http:// or https:// URL"),
    ],
    ids=["port-out-of-range", "port-not-a-number", "upstream-without-scheme"],
)
def test_a_bad_flag_is_one_line(tmp_path: Path, args: list[str], pattern: str) -> None:
    assert_one_line(serve(*args, cwd=tmp_path), pattern, 2)


def test_a_port_in_use_is_one_line_and_nothing_left_open(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = serve("--port", str(port), cwd=tmp_path)
    assert_one_line(done, rf"cannot listen on 127\.0\.0\.1:{port}: address already in use", 1)


def test_reload_refuses_a_bad_file_with_the_same_line_and_keeps_the_last_good(config_dir: Path) -> None:
    holder = ConfigHolder(load_settings(config_dir / "proxy.toml"))
    session = config_dir / "sessions" / "example.toml"
    session.write_text(session.read_text().replace("keep_tokens = 8000", "keep_token = 4000"))
    st = session.stat()
    os.utime(session, (st.st_atime + 5, st.st_mtime + 5))
    with pytest.raises(ConfigError) as refused:
        load_settings(config_dir / "proxy.toml")
    assert holder.reload_if_changed() is False
    assert holder.last_error == str(refused.value)
    assert "example.toml:6: [policy.clear_tool_outputs] keep_token: unknown key" in holder.last_error
    assert holder.settings.policy_for("example-1")[0].clear_tool_outputs.keep_tokens == 8000


def test_reload_names_the_changed_file_and_the_keys_that_wait_for_a_restart(
    config_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holder = ConfigHolder(load_settings(config_dir / "proxy.toml"))
    session, main = config_dir / "sessions" / "example.toml", config_dir / "proxy.toml"
    session.write_text(session.read_text().replace("keep_tokens = 8000", "keep_tokens = 4000"))
    main.write_text(
        main.read_text().replace("port = 8787", "port = 8788").replace("body_memo_mb = 64", "body_memo_mb = 8")
    )
    for path in (session, main):
        st = path.stat()
        os.utime(path, (st.st_atime + 5, st.st_mtime + 5))
    caplog.set_level("INFO", logger="proxy.config")
    assert holder.reload_if_changed() is True
    lines = [record.getMessage() for record in caplog.records]
    assert f"config reloaded ({main}, {session} changed)" in lines
    assert "config: server.port changed; that takes effect after a restart" in lines  # body_memo_mb is live
    assert holder.settings.server.port == 8787 and holder.settings.state.body_memo_mb == 8
