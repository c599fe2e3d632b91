"""The one config loader: `proxy.toml` plus `sessions/*.toml`, re-read when they change.

Every key is checked (`proxy.config.schema`): a broken file is reported in one line with its
path, line and key, and on reload the last good version stays in force.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import logging
import os
import stat
import tomllib
import typing
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from proxy.config.schema import ConfigError, Source, checked, validate
from proxy.context.policy import ModelInfo, Policy, policy_from_dict

log = logging.getLogger("proxy.config")

# Model names come from clients: lookups are remembered per Settings up to this many names.
MAX_MODELS_CACHED = 1024

# Packaged with the code (package data), so any install serves from any folder; copy it to change it.
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "data" / "config" / "proxy.toml"


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8787
    max_body_mb: float = 32
    # Env var holding a token for /sessions and /metrics; required off loopback.
    admin_token_env: str = ""
    # Hostile clients (proxy/shell/connection_guard.py, proxy/shell/body_reader.py): with these, a client silent for
    # 60 s anywhere before its request is complete is closed, and memory for bodies is bounded.
    max_connections: int = 1000  # past it a new connection gets 503 and is closed
    header_timeout_s: float = 60  # a request head must be complete this long after its first byte
    body_timeout_s: float = 60  # longest silence while a request body is read (408)
    keepalive_timeout_s: float = 60  # an idle connection (no request under way) is closed after this
    body_budget_mb: float = 96  # request bodies held in memory at once, all requests together (past it: 503)
    # A relayed WebSocket (Codex's WebSocket mode): each side pinged this often, closed when its pong is late
    # (half of it); both closed after this long with no message either way, so idle sockets free their slots.
    websocket_heartbeat_s: float = 30
    websocket_idle_timeout_s: float = 300


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
    place_breakpoints: bool = True  # add cache_control breakpoints where the client left slots (never past 4)


@dataclass(frozen=True)
class ResponsesConfig:
    """The Responses API (`/v1/responses`): a client without `prompt_cache_key` gets its session id as one."""

    set_prompt_cache_key: bool = True


@dataclass(frozen=True)
class StateConfig:
    max_sessions: int = 1000
    # Sessions (journals, turn details, conversations) and body memos together, in this process's memory;
    # the least recently used sessions are evicted past it. 512 MB holds ~1,500 agent sessions of 2,000
    # messages and 100 turn details (~330 KB each): more than max_sessions, on any host that runs agents.
    memory_mb: float = 512
    idle_ttl_s: float = 6 * 3600
    path: str = ""  # SQLite file; empty = memory only
    body_memo_mb: float = 64  # last bodies of recent sessions, so a warm turn parses only what is new; 0 = off
    # A session's size in memory (~120 bytes a message, more with recall hashes: 8 MB is some 50k messages,
    # ~1.8 MB stored, what the 2 MB stored bound kept before); past it, it is kept nowhere after its turn.
    max_session_kb: float = 8192
    redis_url: str = ""  # redis://host:port/db (rediss:// for TLS): sessions shared by every instance and worker
    redis_password_env: str = ""  # env var with the Redis password, when it is not in the URL
    redis_timeout_ms: float = 250  # one Redis call; past it the turn goes on from this process's own state
    redis_retry_s: float = 1.0  # after a failure, Redis is tried again this long after
    redis_cluster: bool = False  # redis_url names one node of a Redis Cluster (each session in one hash slot)

    @property
    def body_memo_bytes(self) -> int:
        return int(self.body_memo_mb * 1024 * 1024)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_mb * 1024 * 1024)

    @property
    def max_session_bytes(self) -> int:
        return int(self.max_session_kb * 1024)


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
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)
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


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


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
        return policy_from_dict(_deep_merge(base, overrides))
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
