"""`context-proxy wrap codex [ARGS...]`: Codex CLI through the proxy, in HTTP mode, its exit code passed through.

Codex is pointed at the proxy by `-c` overrides placed before the user's arguments (a later
`-c` of the user's own still wins): a model provider `context-proxy` whose base URL is the
proxy's `/v1`, speaking the Responses API with the key from `OPENAI_API_KEY`, and WebSocket
mode off (in it Codex sends only new input against server state, which the proxy can only
relay unedited: the savings are in HTTP mode). Nothing is written to the user's config.toml.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.wrap.launch import run_agent

PROVIDER = "context-proxy"
KEY_ENV = "OPENAI_API_KEY"


def _toml_string(value: str) -> str:
    """A TOML basic string (Codex parses each `-c` value as TOML)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def provider_overrides(base_url: str, *, env_key: str = KEY_ENV, websockets: bool = False) -> list[str]:
    """The `-c key=value` arguments that make `base_url` (ending in /v1) Codex's model provider."""
    settings = {
        "model_provider": _toml_string(PROVIDER),
        f"model_providers.{PROVIDER}.name": _toml_string("OpenAI via context-proxy"),
        f"model_providers.{PROVIDER}.base_url": _toml_string(base_url),
        f"model_providers.{PROVIDER}.wire_api": _toml_string("responses"),
        f"model_providers.{PROVIDER}.env_key": _toml_string(env_key),
        f"model_providers.{PROVIDER}.supports_websockets": "true" if websockets else "false",
    }
    args: list[str] = []
    for key, value in settings.items():
        args += ["-c", f"{key}={value}"]
    return args


def command(base_url: str, args: Sequence[str], binary: str = "codex") -> list[str]:
    """The command line that runs Codex through the proxy at `base_url` with the user's `args`."""
    return [binary, *provider_overrides(base_url), *args]


def run(base_url: str, args: Sequence[str]) -> int:
    """Run Codex through the proxy and return its exit code (127 when it is not installed)."""
    return run_agent("codex", "@openai/codex", lambda binary: command(base_url, args, binary))
