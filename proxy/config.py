"""The one config loader: `proxy.toml` plus `sessions/*.toml`, re-read when they change.

A broken file is reported with its path (and line, for TOML errors) and the last
good version stays in force.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from proxy.context.policy import ModelInfo, Policy, policy_from_dict

log = logging.getLogger("proxy.config")

# Model names come from clients: lookups are remembered per Settings up to this many names.
MAX_MODELS_CACHED = 1024

# Packaged with the code (package data), so any install serves from any folder; copy it to change it.
DEFAULT_CONFIG = Path(__file__).resolve().parent / "data" / "config" / "proxy.toml"


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8787
    max_body_mb: float = 32
    # Env var holding a token for /sessions and /metrics; required off loopback.
    admin_token_env: str = ""


@dataclass(frozen=True)
class UpstreamConfig:
    base_url: str = "https://api.openai.com/v1"
    api_key_env: str = ""
    connect_timeout_s: float = 10
    read_timeout_s: float = 600


@dataclass(frozen=True)
class AnthropicConfig:
    """Anthropic's Messages API (`/v1/messages*`, and any request with `anthropic-version`) goes here."""

    base_url: str = "https://api.anthropic.com"  # without /v1
    api_key_env: str = ""  # set: the proxy sends $VAR's key as x-api-key, never the client's
    place_breakpoints: bool = (
        True  # add cache_control breakpoints where the client left slots (proxy.dialects.breakpoints)
    )


@dataclass(frozen=True)
class StateConfig:
    max_sessions: int = 1000
    idle_ttl_s: float = 6 * 3600
    path: str = ""  # SQLite file; empty = memory only
    body_memo_mb: float = 64  # last bodies of recent sessions, so a warm turn parses only what is new; 0 = off

    @property
    def body_memo_bytes(self) -> int:
        return int(self.body_memo_mb * 1024 * 1024)


@dataclass(frozen=True)
class AuthConfig:
    keys_env: str = ""  # env var with comma-separated proxy access keys; empty = open


@dataclass(frozen=True)
class CapsuleSpec:
    id: str
    kind: str
    text: str
    tags: tuple[str, ...] = ()
    confidence: float = 1.0


@dataclass(frozen=True)
class SessionRule:
    """One `sessions/*.toml`: which session ids it matches, its policy overrides, its capsules."""

    path: str
    match: tuple[str, ...]
    policy: dict[str, Any] = field(default_factory=dict)
    capsules: tuple[CapsuleSpec, ...] = ()

    def matches(self, session_id: str) -> bool:
        return any(p == session_id or fnmatch.fnmatchcase(session_id, p) for p in self.match)


@dataclass(frozen=True)
class Settings:
    server: ServerConfig = field(default_factory=ServerConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    state: StateConfig = field(default_factory=StateConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    anthropic: AnthropicConfig = field(default_factory=AnthropicConfig)
    models: tuple[ModelInfo, ...] = ()
    default_encoding: str = "o200k_base"
    policy_data: dict[str, Any] = field(default_factory=dict)
    policy: Policy = field(default_factory=Policy)
    sessions: tuple[SessionRule, ...] = ()
    path: str = ""
    # Per-object memos of the lookups every request makes (a reload builds a new Settings, so they never go stale).
    _models_by_name: dict[str, ModelInfo] = field(default_factory=dict, init=False, repr=False, compare=False)
    _rule_policies: dict[str, Policy] = field(default_factory=dict, init=False, repr=False, compare=False)

    def model(self, name: str) -> ModelInfo:
        """The most specific model-table glob matching `name` (fewest wildcards, longest)."""
        info = self._models_by_name.get(name)
        if info is None:
            info = self._match_model(name)
            if len(self._models_by_name) < MAX_MODELS_CACHED:
                self._models_by_name[name] = info
        return info

    def _match_model(self, name: str) -> ModelInfo:
        best: ModelInfo | None = None
        best_key = (-1, -1)
        for info in self.models:
            if fnmatch.fnmatchcase(name, info.pattern):
                literal = len(info.pattern.replace("*", "").replace("?", ""))
                key = (literal, -info.pattern.count("*"))
                if key > best_key:
                    best, best_key = info, key
        return best or ModelInfo(encoding=self.default_encoding)

    def session_rule(self, session_id: str) -> SessionRule | None:
        """The first session file (in name order) whose `match` takes this id; exact ids win."""
        exact = [r for r in self.sessions if session_id in r.match]
        if exact:
            return exact[0]
        return next((r for r in self.sessions if r.matches(session_id)), None)

    def policy_for(self, session_id: str) -> tuple[Policy, tuple[CapsuleSpec, ...]]:
        rule = self.session_rule(session_id)
        if rule is None:
            return self.policy, ()
        policy = self._rule_policies.get(rule.path)
        if policy is None:
            merged = _deep_merge(self.policy_data, rule.policy)
            name = rule.policy.get("name") or Path(rule.path).stem
            policy = self._rule_policies[rule.path] = policy_from_dict({**merged, "name": name})
        return policy, rule.capsules


class ConfigError(ValueError):
    """A config file that cannot be used, with its path (and line) in the message."""


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc


def _section(cls: type, data: Any, path: Path, name: str) -> Any:
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: [{name}] must be a table")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ConfigError(f"{path}: [{name}]: {exc}") from exc


def _models(data: Any, path: Path) -> tuple[ModelInfo, ...]:
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: [models] must be a table of model globs")
    out = []
    for pattern, row in data.items():
        if not isinstance(row, dict):
            raise ConfigError(f"{path}: [models.{pattern!r}] must be a table")
        try:
            out.append(ModelInfo(pattern=pattern, **row))
        except TypeError as exc:
            raise ConfigError(f"{path}: [models.{pattern!r}]: {exc}") from exc
    return tuple(out)


def _capsules(data: Any, path: Path) -> tuple[CapsuleSpec, ...]:
    if not isinstance(data, list):
        raise ConfigError(f"{path}: [[capsules]] must be an array of tables")
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: capsule #{i + 1} must be a table")
        item = dict(item)
        if "file" in item:
            file = (path.parent / str(item.pop("file"))).resolve()
            try:
                item["text"] = file.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"{path}: capsule #{i + 1}: cannot read {file}: {exc.strerror}") from exc
        item["tags"] = tuple(item.get("tags", ()))
        try:
            out.append(CapsuleSpec(**item))
        except TypeError as exc:
            raise ConfigError(f"{path}: capsule #{i + 1}: {exc}") from exc
    return tuple(out)


def load_session_rule(path: Path, policy_data: dict[str, Any]) -> SessionRule:
    data = _read_toml(path)
    match = data.get("match", [])
    if isinstance(match, str):
        match = [match]
    if not isinstance(match, list) or not all(isinstance(m, str) for m in match):
        raise ConfigError(f"{path}: match must be a list of session ids or globs")
    overrides = data.get("policy", {})
    if not isinstance(overrides, dict):
        raise ConfigError(f"{path}: [policy] must be a table")
    try:  # validate now, so a bad override is reported at load, not at request time
        policy_from_dict(_deep_merge(policy_data, overrides))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: [policy]: {exc}") from exc
    return SessionRule(str(path), tuple(match), overrides, _capsules(data.get("capsules", []), path))


def load_settings(
    path: str | Path | None = None, upstream_url: str | None = None, anthropic_url: str | None = None
) -> Settings:
    """Read `proxy.toml` and the `sessions/` folder beside it; raise ConfigError on a broken one."""
    path = Path(path) if path else DEFAULT_CONFIG
    data = _read_toml(path)
    policy_data = data.get("policy", {})
    if not isinstance(policy_data, dict):
        raise ConfigError(f"{path}: [policy] must be a table")
    try:
        policy = policy_from_dict(policy_data)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: [policy]: {exc}") from exc
    upstream = _section(UpstreamConfig, data.get("upstream"), path, "upstream")
    if upstream_url:
        upstream = replace(upstream, base_url=upstream_url)
    state = _section(StateConfig, data.get("state"), path, "state")
    anthropic = _section(AnthropicConfig, data.get("anthropic"), path, "anthropic")
    if anthropic_url:
        anthropic = replace(anthropic, base_url=anthropic_url)
    if state.path and not Path(state.path).is_absolute():  # relative to the config file, not the cwd
        state = replace(state, path=str(path.parent / state.path))
    settings = Settings(
        server=_section(ServerConfig, data.get("server"), path, "server"),
        upstream=upstream,
        state=state,
        auth=_section(AuthConfig, data.get("auth"), path, "auth"),
        anthropic=anthropic,
        models=_models(data.get("models", {}), path),
        default_encoding=str(data.get("default_encoding", "o200k_base")),
        policy_data=policy_data,
        policy=policy,
        path=str(path),
    )
    return replace(settings, sessions=_load_sessions(path.parent / "sessions", policy_data))


def _load_sessions(folder: Path, policy_data: dict[str, Any]) -> tuple[SessionRule, ...]:
    if not folder.is_dir():
        return ()
    return tuple(load_session_rule(p, policy_data) for p in sorted(folder.glob("*.toml")))


def config_files(settings: Settings) -> list[Path]:
    """Every file whose change should trigger a reload."""
    base = Path(settings.path)
    folder = base.parent / "sessions"
    return [base, folder, *sorted(folder.glob("*.toml"))] if folder.is_dir() else [base]


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
        self._stamp = stamp
        try:
            fresh = load_settings(self.settings.path, self.upstream_url)
        except ConfigError as exc:
            self.last_error = str(exc)
            log.error("config not reloaded, keeping the last good version: %s", exc)
            return False
        # A running server keeps its bind address and upstream; the rest takes effect.
        self.settings = replace(
            fresh,
            server=self.settings.server,
            upstream=self.settings.upstream,
            anthropic=replace(fresh.anthropic, base_url=self.settings.anthropic.base_url),
        )
        self.last_error = None
        log.info("config reloaded from %s", self.settings.path)
        return True
