"""The config's typed form: one frozen dataclass per `proxy.toml` section, and `Settings`, which holds them.

`loader.py` reads the files into these (every key checked against them by `schema.py`); a new key is a new
field here. `Settings` answers the per-request lookups: a model's table entry, a session's policy.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.context.policy import ModelInfo, Policy, policy_from_dict

# Model names come from clients: lookups are remembered per Settings up to this many names.
MAX_MODELS_CACHED = 1024


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
            merged = deep_merge(self.policy_data, rule.policy)
            name = rule.policy.get("name") or Path(rule.path).stem
            policy = self._rule_policies[rule.path] = policy_from_dict({**merged, "name": name})
        return policy, rule.capsules


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
