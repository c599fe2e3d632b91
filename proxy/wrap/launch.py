"""`context-proxy wrap AGENT [ARGS...]`: the proxy already running, or one started for the agent's run.

The proxy is looked for where `CONTEXT_PROXY_URL` says, else where the config serves
(`[server] host`/`port`, 127.0.0.1:8787 by default): a `/healthz` that answers as this proxy
does is used as it is. Otherwise `context-proxy serve` is started on a free port of 127.0.0.1
with the same config (and `--upstream`, if given), its log in a temporary file, and stopped
when the agent exits. The agent's exit code is the command's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from proxy.config.loader import ConfigError, load_settings

START_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 1.0
URL_ENV = "CONTEXT_PROXY_URL"
_LISTENING = re.compile(r"listening on (http://[^\s,]+)")


@dataclass
class Proxy:
    """A proxy to run an agent through: its root URL (no /v1), and the process when this command started it."""

    root: str
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    @property
    def base_url(self) -> str:
        return self.root.rstrip("/") + "/v1"


def is_proxy(root: str) -> bool:
    """Whether `root` answers `/healthz` the way this proxy does."""
    try:
        with urllib.request.urlopen(root.rstrip("/") + "/healthz", timeout=PROBE_TIMEOUT_S) as answer:
            body = orjson.loads(answer.read())
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return isinstance(body, dict) and body.get("status") == "ok" and "state" in body


def configured_root(config: str | None) -> str:
    """Where the config serves the proxy (a wildcard host is reached on loopback)."""
    server = load_settings(config).server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "") else server.host
    return f"http://{'[' + host + ']' if ':' in host else host}:{server.port}"


def _start(config: str | None, upstreams: Sequence[tuple[str, str | None]]) -> Proxy:
    """`context-proxy serve` on a free loopback port; returns once it listens (raises when it does not)."""
    log = Path(tempfile.mkstemp(prefix="context-proxy-wrap-", suffix=".log")[1])
    args = [sys.executable, "-m", "proxy", "serve", "--host", "127.0.0.1", "--port", "0"]
    args += ["--config", config] if config else []
    args += [item for flag, url in upstreams if url for item in (flag, url)]
    with log.open("wb") as sink:
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        if (found := _LISTENING.search(log.read_text(errors="replace"))) and is_proxy(found[1]):
            return Proxy(found[1], process, log)
        time.sleep(0.05)
    _stop(process)
    raise RuntimeError(f"the proxy did not start; its log: {log}\n{log.read_text(errors='replace')[-2000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextlib.contextmanager
def proxy_for_agent(
    config: str | None = None, upstream: str | None = None, anthropic_upstream: str | None = None
) -> Iterator[Proxy]:
    """The proxy running where `CONTEXT_PROXY_URL` or the config says, else one started for as long as this lasts
    (always started when an upstream is named)."""
    named = os.environ.get(URL_ENV)
    if named:
        root = named.rstrip("/").removesuffix("/v1")
        if not is_proxy(root):
            raise RuntimeError(f"{URL_ENV}={named} does not answer as context-proxy (GET /healthz)")
        yield Proxy(root)
        return
    root = configured_root(config)
    if upstream is None and anthropic_upstream is None and is_proxy(root):
        yield Proxy(root)
        return
    proxy = _start(config, [("--upstream", upstream), ("--anthropic-upstream", anthropic_upstream)])
    try:
        yield proxy
    finally:
        assert proxy.process is not None
        _stop(proxy.process)
        if proxy.log is not None:
            proxy.log.unlink(missing_ok=True)


def run_agent(
    name: str, package: str, command: Callable[[str], list[str]], env: Mapping[str, str] | None = None
) -> int:
    """Run the agent `name` (`CONTEXT_PROXY_<NAME>` or PATH's) as `command(binary)`, with `env` over the environment
    if given; its exit code (127 when it is not installed)."""
    binary = os.environ.get(f"CONTEXT_PROXY_{name.upper()}") or shutil.which(name)
    if binary is None:
        print(f"context-proxy wrap {name}: {name} is not on PATH (npm install -g {package})", flush=True)
        return 127
    return subprocess.call(command(binary), env=None if env is None else {**os.environ, **env})


def _agents() -> dict[str, Callable[[str, Sequence[str]], int]]:
    """Each agent's runner: its proxy's base URL (ending in /v1) and the user's arguments -> its exit code."""
    from proxy.wrap import claude, codex

    return {"claude": claude.run, "codex": codex.run}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="context-proxy wrap",
        description="Run an agent CLI through the proxy: the one already running, or one started for the run.",
    )
    parser.add_argument("--config", metavar="FILE", help="proxy.toml for the proxy looked for or started")
    parser.add_argument("--upstream", metavar="URL", help="start a proxy forwarding to URL (never reuse one)")
    parser.add_argument(
        "--anthropic-upstream", metavar="URL", help="start a proxy forwarding Anthropic requests to URL (without /v1)"
    )
    parser.add_argument("agent", choices=sorted(_agents()), help="the agent CLI to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments, as you would give them to it")
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    try:
        with proxy_for_agent(args.config, args.upstream, args.anthropic_upstream) as proxy:
            return _agents()[args.agent](proxy.base_url, args.args)
    except (ConfigError, RuntimeError) as exc:
        print(f"context-proxy wrap: {exc}", file=sys.stderr)
        return 2
