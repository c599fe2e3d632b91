"""The one config loader: `proxy.toml` plus `sessions/*.toml`, re-read when they change.

Every key is checked (`proxy.config.schema`): a broken file is reported in one line with its
path, line and key, and on reload the last good version stays in force.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import tomllib
import typing
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from proxy.config.schema import ConfigError, Source, checked, validate
from proxy.config.settings import AnthropicConfig, CapsuleSpec, SessionRule, Settings, UpstreamConfig, deep_merge
from proxy.context.policy import ModelInfo, Policy, policy_from_dict

log = logging.getLogger("proxy.config")

# Packaged with the code (package data), so any install serves from any folder; copy it to change it.
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "data" / "config" / "proxy.toml"


def read_regular(path: Path) -> str:
    """A regular file's UTF-8 text. Opened without blocking and checked before it is read: a FIFO (or a device)
    put where a config file is expected would block the read, and the reload thread with it, forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read().decode("utf-8")
    finally:
        os.close(fd)


def _read_toml(path: Path) -> tuple[dict[str, Any], Source]:
    try:
        text = read_regular(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc.reason}") from exc
    try:
        return tomllib.loads(text), Source(path, text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _sections() -> dict[str, type]:
    """The plain sections of proxy.toml: every dataclass field of Settings but the policy."""
    hints = typing.get_type_hints(Settings)
    return {f.name: hints[f.name] for f in fields(Settings) if is_dataclass(hints[f.name]) and f.name != "policy"}


def _policy(base: dict[str, Any], overrides: Any, source: Source) -> Policy:
    """The policy `overrides` make of `base` (both TOML-shaped), every key checked."""
    validate(Policy, overrides, source, ["policy"])
    try:
        return policy_from_dict(deep_merge(base, overrides))
    except ValueError as exc:  # what no single key says (low_water above high_water, ...)
        raise source.error(["policy"], None, str(exc)) from None


@functools.cache
def packaged_models() -> tuple[ModelInfo, ...]:
    """The packaged config's model table: what a config file without a `[models]` table of its own uses."""
    data, source = _read_toml(DEFAULT_CONFIG)
    return _models(data.get("models", {}), source)


def _models(data: Any, source: Source) -> tuple[ModelInfo, ...]:
    if not isinstance(data, dict):
        raise source.error(["models"], None, "must be a table of model globs")
    return tuple(checked(ModelInfo, row, source, ["models", glob], pattern=glob) for glob, row in data.items())


def _capsules(data: Any, source: Source) -> tuple[CapsuleSpec, ...]:
    if not isinstance(data, list):
        raise source.error([], "capsules", "must be an array of tables ([[capsules]])")
    out = []
    for i, item in enumerate(data):
        item = dict(item) if isinstance(item, dict) else item
        if isinstance(item, dict) and "file" in item:
            file = (source.path.parent / str(item.pop("file"))).resolve()
            try:
                item["text"] = read_regular(file)
            except OSError as exc:
                raise source.error(["capsules", i], "file", f"cannot read {file}: {exc.strerror}") from None
        out.append(checked(CapsuleSpec, item, source, ["capsules", i]))
    return tuple(out)


def load_session_rule(path: Path, policy_data: dict[str, Any]) -> SessionRule:
    data, source = _read_toml(path)
    source.refuse_unknown(data, ["match", "policy", "capsules"])
    match = data.get("match")
    if isinstance(match, str):
        match = [match]
    if not match or not isinstance(match, list) or not all(isinstance(m, str) for m in match):
        problem = "required: the session ids or globs this file applies to" if match is None else "must be"
        raise source.error([], "match", problem if match is None else f"{problem} a list of session ids or globs")
    overrides = data.get("policy", {})
    _policy(policy_data, overrides, source)  # checked now, so a bad override is reported at load, not per request
    return SessionRule(str(path), tuple(match), overrides, _capsules(data.get("capsules", []), source))


def load_settings(
    path: str | Path | None = None, upstream_url: str | None = None, anthropic_url: str | None = None
) -> Settings:
    """Read `proxy.toml` and the `sessions/` folder beside it; raise ConfigError (one line) on a broken one."""
    path = Path(path) if path else DEFAULT_CONFIG
    data, source = _read_toml(path)
    internal = {"policy_data", "sessions", "path"}
    source.refuse_unknown(data, [f.name for f in fields(Settings) if f.init and f.name not in internal])
    validate(Settings, data, source, [], only=frozenset({"default_encoding"}))
    policy_data = data.get("policy", {})
    policy = _policy({}, policy_data, source)
    sections: dict[str, Any] = {name: checked(cls, data.get(name), source, [name]) for name, cls in _sections().items()}
    if upstream_url:
        validate(UpstreamConfig, {"base_url": upstream_url}, Source(Path("--upstream")), [])
        sections["upstream"] = replace(sections["upstream"], base_url=upstream_url)
    if anthropic_url:
        validate(AnthropicConfig, {"base_url": anthropic_url}, Source(Path("--anthropic-upstream")), [])
        sections["anthropic"] = replace(sections["anthropic"], base_url=anthropic_url)
    state = sections["state"]
    if state.path and not Path(state.path).is_absolute():  # relative to the config file, not the cwd
        sections["state"] = replace(state, path=str(path.parent / state.path))
    settings = Settings(
        **sections,
        models=_models(data["models"], source) if "models" in data else packaged_models(),
        default_encoding=str(data.get("default_encoding", "o200k_base")),
        policy_data=policy_data,
        policy=policy,
        path=str(path),
    )
    return replace(settings, sessions=_load_sessions(path.parent / "sessions", policy_data))


def session_files(folder: Path) -> list[Path]:
    """The `*.toml` regular files of `sessions/` (a symlink to one counts): a FIFO, a socket or a folder named
    so is no config and is passed over, never opened."""
    return sorted(p for p in folder.glob("*.toml") if p.is_file()) if folder.is_dir() else []


def _load_sessions(folder: Path, policy_data: dict[str, Any]) -> tuple[SessionRule, ...]:
    return tuple(load_session_rule(p, policy_data) for p in session_files(folder))


def config_files(settings: Settings) -> list[Path]:
    """Every file whose change should trigger a reload."""
    base = Path(settings.path)
    folder = base.parent / "sessions"
    return [base, folder, *session_files(folder)] if folder.is_dir() else [base]


def snapshot(paths: list[Path]) -> tuple[tuple[str, float, int], ...]:
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((str(p), st.st_mtime, st.st_size))
        except OSError:
            out.append((str(p), 0.0, -1))
    return tuple(out)


class ConfigHolder:
    """Holds the settings in force; `reload_if_changed()` swaps them only for a good read."""

    def __init__(self, settings: Settings, upstream_url: str | None = None) -> None:
        self.settings = settings
        self.upstream_url = upstream_url
        self.last_error: str | None = None
        self._stamp = snapshot(config_files(settings))

    def reload_if_changed(self) -> bool:
        stamp = snapshot(config_files(self.settings))
        if stamp == self._stamp or not self.settings.path:
            return False
        changed = _changed_files(self._stamp, stamp)
        self._stamp = stamp
        try:
            fresh = load_settings(self.settings.path, self.upstream_url)
        except ConfigError as exc:
            self.last_error = str(exc)
            log.error("config not reloaded, keeping the last good version: %s", exc)
            return False
        if waiting := _needs_restart(self.settings, fresh):
            log.warning("config: %s changed; that takes effect after a restart", ", ".join(waiting))
        # A running server keeps its bind address and upstream; the rest takes effect.
        self.settings = replace(
            fresh,
            server=self.settings.server,
            upstream=self.settings.upstream,
            anthropic=replace(fresh.anthropic, base_url=self.settings.anthropic.base_url),
        )
        self.last_error = None
        log.info("config reloaded (%s changed)", ", ".join(changed) or self.settings.path)
        return True


# Read once at start: a change to these is reported on reload as waiting for a restart.
RESTART_SECTIONS = ("server", "upstream", "state")
LIVE_ON_RELOAD = frozenset({"state.body_memo_mb"})


def _needs_restart(running: Settings, fresh: Settings) -> list[str]:
    """`section.key` of every changed key the running process cannot take without a restart."""
    out = []
    for section in RESTART_SECTIONS:
        old, new = getattr(running, section), getattr(fresh, section)
        for f in fields(old):
            name = f"{section}.{f.name}"
            if getattr(old, f.name) != getattr(new, f.name) and name not in LIVE_ON_RELOAD:
                out.append(name)
    return out


def _changed_files(before: tuple[tuple[str, float, int], ...], after: tuple[tuple[str, float, int], ...]) -> list[str]:
    """The files (not folders) added, removed or changed between two snapshots."""
    old = {path: rest for path, *rest in before}
    new = {path: rest for path, *rest in after}
    return sorted(p for p in old.keys() | new.keys() if old.get(p) != new.get(p) and not os.path.isdir(p))
