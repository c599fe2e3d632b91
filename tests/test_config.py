"""The one config loader: defaults, model table, session overrides, reload keeping the last good."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from proxy.config.loader import (
    DEFAULT_CONFIG,
    ConfigError,
    ConfigHolder,
    ServerConfig,
    StateConfig,
    UpstreamConfig,
    load_settings,
)
from proxy.context.policy import Policy


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


@pytest.mark.parametrize("value", ["-1", "inf", "nan"])
def test_a_first_edit_risk_that_is_negative_or_not_finite_is_refused_in_a_session_file(
    config_dir: Path, value: str
) -> None:
    """Infinite would read as "any bet" on the first edit and turn into nan (no edit at all) on every later one."""
    (config_dir / "sessions" / "bets.toml").write_text(f'match = ["x"]\n[policy]\nfirst_edit_risk_turns = {value}\n')
    with pytest.raises(ConfigError, match=r"bets\.toml:3: \[policy\] first_edit_risk_turns"):
        load_settings(config_dir / "proxy.toml")


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
