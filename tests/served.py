"""The proxy as a user runs it: `python -m proxy serve` in a child process, its log read from stderr.

For the tests that need what only a real process shows: its log lines as written, its file limit,
its memory. `ServedProxy.stop()` ends the child and returns everything it logged.
"""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from proxy.config.loader import DEFAULT_CONFIG

START_TIMEOUT_S = 30
_LISTENING = re.compile(r"listening on http://[^:]+:(\d+)")


@dataclass
class ServedProxy:
    process: subprocess.Popen
    port: int
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return "".join(self.lines)

    def stop(self) -> str:
        """End the child (SIGTERM, then SIGKILL) and return its whole log."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.reader is not None:
            self.reader.join(timeout=10)
        return self.log()


def write_config(folder: Path, server: str = "") -> Path:
    """The shipped config (and its sessions) in `folder`, with `[server]` lines (`key = value`) replaced or added."""
    text = DEFAULT_CONFIG.read_text()
    for line in filter(None, server.splitlines()):
        key = line.split("=")[0].strip()
        text, found = re.subn(rf"(?m)^{key} = .*$", line, text, count=1)
        if not found:
            text = text.replace("[server]\n", f"[server]\n{line}\n", 1)
    path = folder / "proxy.toml"
    path.write_text(text)
    shutil.copytree(DEFAULT_CONFIG.parent / "sessions", folder / "sessions")
    return path


def serve(
    config: Path, *, upstream_url: str, log_level: str = "INFO", max_files: int | None = None, passthrough: bool = False
) -> ServedProxy:
    """Start `python -m proxy serve` on an ephemeral port; `max_files` lowers its descriptor limit."""

    def limit() -> None:
        if max_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, max_files))

    args = [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", "0"]
    args += ["--upstream", upstream_url, "--log-level", log_level] + (["--passthrough"] if passthrough else [])
    process = subprocess.Popen(args, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, preexec_fn=limit)
    served = ServedProxy(process, 0)
    found = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            served.lines.append(line)
            if not found.is_set() and (match := _LISTENING.search(line)):
                served.port = int(match.group(1))
                found.set()
        found.set()

    served.reader = threading.Thread(target=read, daemon=True)
    served.reader.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not found.wait(0.1) and time.monotonic() < deadline:
        pass
    if not served.port:
        raise RuntimeError(f"the proxy did not start:\n{served.stop()}")
    return served
