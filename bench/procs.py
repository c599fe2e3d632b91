"""Benchmark servers in their own processes, and what /proc says about them (CPU seconds, RSS)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_TICKS = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 30.0


@dataclass
class Server:
    """A server process started by `spawn`; `url` is its base URL ending in /v1."""

    kind: str
    proc: subprocess.Popen
    port: int
    engine: str = ""
    info: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


@contextlib.contextmanager
def tree_at(ref: str) -> Iterator[Path]:
    """`git archive REF` unpacked into a temporary folder: a tree to `spawn` an earlier commit's servers from."""
    with tempfile.TemporaryDirectory(prefix="bench-tree-") as folder:
        archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        yield Path(folder)


_LISTENING = re.compile(r"listening on http://[^:]+:(\d+)")


@contextlib.asynccontextmanager
async def serve_config(tree: Path, config: Path, upstream: str, timeout_s: float = 60) -> AsyncIterator[Server]:
    """`context-proxy serve --config CONFIG` run from `tree` (its own code), as a user starts it.

    Its log goes to serve.log beside the config (and is shown when it does not start); SIGTERM at the end.
    """
    log_path = config.parent / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", "0", "--upstream", upstream],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while not (listening := _LISTENING.search(log_path.read_text(errors="replace"))):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"serve from {tree} did not start:\n{log_path.read_text()[-2000:]}")
            await asyncio.sleep(0.1)
        server = Server("serve", proc, int(listening.group(1)))
        yield server
    finally:
        Server("serve", proc, 0).stop()


def spawn(kind: str, *args: str, tree: Path = ROOT) -> Server:
    """Start `python -m bench.serve KIND ARGS` and wait for it to print its port.

    `tree`: a checkout to run from (its own `proxy` and `bench`), e.g. an older commit for `bench ab`.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.serve", kind, *args],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    port, engine = 0, ""
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench server {kind} exited with {proc.wait()} before listening")
        if line.startswith("PORT "):
            port = int(line.split()[1])
        elif line.startswith("ENGINE "):
            engine = line.split()[1]
            return Server(kind, proc, port, engine)
    proc.kill()
    raise RuntimeError(f"bench server {kind} did not start within {START_TIMEOUT_S:.0f} s")


class Servers:
    """The usual trio: the simulator, the bare relay and the proxy in front of it; stopped together."""

    def __init__(self, chunks: int = 16, proxy_args: tuple[str, ...] = ()) -> None:
        self.started: list[Server] = []
        try:
            self.sim = self._add(spawn("sim", "--chunks", str(chunks)))
            self.relay = self._add(spawn("relay", "--upstream", self.sim.url))
            self.proxy = self._add(spawn("proxy", "--upstream", self.sim.url, *proxy_args))
        except BaseException:
            self.close()
            raise

    def _add(self, server: Server) -> Server:
        self.started.append(server)
        return server

    def close(self) -> None:
        for server in reversed(self.started):
            server.stop()

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
