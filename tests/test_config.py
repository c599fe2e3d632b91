"""The one config loader: defaults, model table, session overrides, reload keeping the last good."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.config.loader import DEFAULT_CONFIG, ConfigError, ConfigHolder, load_settings
from proxy.config.settings import ServerConfig, StateConfig, UpstreamConfig
from proxy.context.policy import Policy
from tests.harness import closed_port
from tests.served import serve, write_config


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    shutil.copy(DEFAULT_CONFIG, tmp_path / "proxy.toml")
    shutil.copytree(DEFAULT_CONFIG.parent / "sessions", tmp_path / "sessions")
    return tmp_path


def bump(path: Path) -> None:
    """Move the mtime forward so a reload sees the change even within one clock tick."""
    st = path.stat()
    os.utime(path, (st.st_atime + 5, st.st_mtime + 5))


def test_the_default_config_file_states_the_code_defaults() -> None:
    """config/proxy.toml shows every key with its default: the file and the dataclasses agree."""
    settings = load_settings()
    assert settings.server == ServerConfig()
    assert settings.upstream == UpstreamConfig()
    assert settings.state == StateConfig()
    assert settings.policy == Policy()


def test_the_most_specific_model_glob_wins() -> None:
    settings = load_settings()
    assert settings.model("gpt-4o-mini-2024-07-18").pattern == "gpt-4o-mini*"
    assert settings.model("gpt-4o-2024-08-06").pattern == "gpt-4o*"
    assert settings.model("gpt-4").context_window == 8192
    assert settings.model("some-local-model").pattern == "*"


def test_upstream_flag_overrides_the_config() -> None:
    assert load_settings(upstream_url="http://127.0.0.1:9/v1").upstream.base_url == "http://127.0.0.1:9/v1"


def test_session_files_override_policy_keys_and_add_capsules() -> None:
    settings = load_settings()
    policy, capsules = settings.policy_for("example-7")
    assert policy.name == "example"
    assert policy.clear_tool_outputs.keep_tokens == 8000
    assert policy.clear_tool_outputs.keep_under == settings.policy.clear_tool_outputs.keep_under  # not overridden
    assert [c.id for c in capsules] == ["tests-convention"]
    assert settings.policy_for("someone-else") == (settings.policy, ())


def test_capsules_can_come_from_files_relative_to_the_config(config_dir: Path) -> None:
    (config_dir / "capsules").mkdir()
    (config_dir / "capsules" / "style.md").write_text("Use black.")
    (config_dir / "sessions" / "files.toml").write_text(
        'match = ["exact-id"]\n[[capsules]]\nid = "style"\nkind = "convention"\nfile = "../capsules/style.md"\n'
    )
    _, capsules = load_settings(config_dir / "proxy.toml").policy_for("exact-id")
    assert capsules[0].text == "Use black."


def test_a_broken_file_names_its_path_and_line(config_dir: Path) -> None:
    (config_dir / "sessions" / "bad.toml").write_text('match = ["x"]\n[policy\n')
    with pytest.raises(ConfigError, match=r"bad\.toml.*line 2"):
        load_settings(config_dir / "proxy.toml")


def test_an_invalid_policy_value_is_reported(config_dir: Path) -> None:
    (config_dir / "sessions" / "bad.toml").write_text('match = ["x"]\n[policy]\ntruncation = "sideways"\n')
    with pytest.raises(ConfigError, match="truncation"):
        load_settings(config_dir / "proxy.toml")


@pytest.mark.parametrize("key", ["first_edit_risk_turns", "bet_overrun"])
@pytest.mark.parametrize("value", ["-1", "inf", "nan"])
def test_a_bet_that_is_negative_or_not_finite_is_refused_in_a_session_file(
    config_dir: Path, key: str, value: str
) -> None:
    """Infinite would read as "any bet" on the first edit and turn into nan (no edit at all) on every later one."""
    (config_dir / "sessions" / "bets.toml").write_text(f'match = ["x"]\n[policy]\n{key} = {value}\n')
    with pytest.raises(ConfigError, match=rf"bets\.toml:3: \[policy\] {key}"):
        load_settings(config_dir / "proxy.toml")


def test_a_session_file_sets_the_bet_overrun(config_dir: Path) -> None:
    (config_dir / "sessions" / "bets.toml").write_text('match = ["fleet-*"]\n[policy]\nbet_overrun = 0.2\n')
    settings = load_settings(config_dir / "proxy.toml")
    assert settings.policy.bet_overrun == 0.1 and settings.policy_for("fleet-1")[0].bet_overrun == 0.2


def test_a_session_file_turns_compaction_off_and_a_string_for_it_is_refused(config_dir: Path) -> None:
    (config_dir / "sessions" / "plain.toml").write_text('match = ["plain-*"]\n[policy]\ncompact = false\n')
    settings = load_settings(config_dir / "proxy.toml")
    assert settings.policy.compact and not settings.policy_for("plain-1")[0].compact
    (config_dir / "sessions" / "plain.toml").write_text('match = ["plain-*"]\n[policy]\ncompact = "no"\n')
    with pytest.raises(ConfigError, match=r"plain\.toml:3: \[policy\] compact"):
        load_settings(config_dir / "proxy.toml")


def test_a_session_file_asks_for_the_lossless_mode_and_an_unknown_mode_is_refused(config_dir: Path) -> None:
    (config_dir / "sessions" / "careful.toml").write_text('match = ["careful-*"]\n[policy]\nmode = "lossless"\n')
    settings = load_settings(config_dir / "proxy.toml")
    assert not settings.policy.lossless and settings.policy_for("careful-1")[0].lossless
    (config_dir / "sessions" / "careful.toml").write_text('match = ["careful-*"]\n[policy]\nmode = "lossy"\n')
    with pytest.raises(ConfigError, match=r"careful\.toml:3: \[policy\] mode"):
        load_settings(config_dir / "proxy.toml")


def test_reload_takes_a_good_change_and_keeps_the_last_good_on_a_broken_one(config_dir: Path) -> None:
    holder = ConfigHolder(load_settings(config_dir / "proxy.toml"))
    assert holder.reload_if_changed() is False

    session = config_dir / "sessions" / "example.toml"
    session.write_text(session.read_text().replace("keep_tokens = 8000", "keep_tokens = 4000"))
    bump(session)
    assert holder.reload_if_changed() is True
    assert holder.settings.policy_for("example-1")[0].clear_tool_outputs.keep_tokens == 4000

    session.write_text("match = [\n")
    bump(session)
    assert holder.reload_if_changed() is False
    assert "example.toml" in (holder.last_error or "")
    assert holder.settings.policy_for("example-1")[0].clear_tool_outputs.keep_tokens == 4000


def test_a_relative_state_path_is_relative_to_the_config_file(config_dir: Path) -> None:
    toml = config_dir / "proxy.toml"
    toml.write_text(toml.read_text().replace('path = ""', 'path = "state/journals.sqlite"'))
    assert load_settings(toml).state.path == str(config_dir / "state" / "journals.sqlite")


def _within(seconds: float, fifo: Path, call: Callable[[], object]) -> list[object]:
    """`call()`'s result or exception, in a thread; one blocked on `fifo` past `seconds` is let go by a writer
    opening it, so the test fails instead of hanging."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # the caller asserts on what it got
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=seconds)
    if thread.is_alive():
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout=5)
        return ["blocked"]
    return out


def test_a_fifo_in_sessions_is_passed_over_and_the_reload_goes_on(config_dir: Path) -> None:
    """A FIFO named like a session file would block the reload thread on its open forever: it is never opened."""
    holder = ConfigHolder(load_settings(config_dir / "proxy.toml"))
    fifo = config_dir / "sessions" / "stuck.toml"
    os.mkfifo(fifo)
    session = config_dir / "sessions" / "example.toml"
    session.write_text(session.read_text().replace("keep_tokens = 8000", "keep_tokens = 4000"))
    bump(session)
    assert _within(20, fifo, holder.reload_if_changed) == [True]
    assert holder.settings.policy_for("example-1")[0].clear_tool_outputs.keep_tokens == 4000


def test_a_capsule_file_that_is_a_fifo_is_a_config_error(config_dir: Path) -> None:
    fifo = config_dir / "sessions" / "capsule.md"
    os.mkfifo(fifo)
    (config_dir / "sessions" / "fed.toml").write_text('match = ["fed-*"]\n[[capsules]]\nfile = "capsule.md"\n')
    [error] = _within(20, fifo, lambda: load_settings(config_dir / "proxy.toml"))
    assert isinstance(error, ConfigError) and "not a regular file" in str(error)


def test_a_served_proxy_with_a_fifo_in_sessions_reloads_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The process as a user runs it: a change beside the FIFO is applied, and SIGTERM still ends it (a reload
    thread blocked on the FIFO kept the process alive past SIGTERM)."""
    config = write_config(tmp_path)
    os.mkfifo(tmp_path / "sessions" / "stuck.toml")
    proxy = serve(config, upstream_url=f"http://127.0.0.1:{closed_port()}/v1", passthrough=True)
    try:
        session = tmp_path / "sessions" / "example.toml"
        time.sleep(1.5)  # past one watch interval, so the change below is a change
        session.write_text(session.read_text().replace("keep_tokens = 8000", "keep_tokens = 4000"))
        bump(session)
        deadline = time.monotonic() + 20
        while "config reloaded" not in proxy.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "config reloaded (" in proxy.log() and "example.toml" in proxy.log()
        proxy.process.terminate()
        try:
            code = proxy.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            code = None
        assert code is not None, "SIGTERM did not stop the proxy"
    finally:
        if proxy.process.poll() is None:
            with contextlib.suppress(OSError):
                os.close(os.open(tmp_path / "sessions" / "stuck.toml", os.O_WRONLY | os.O_NONBLOCK))
        proxy.stop()
