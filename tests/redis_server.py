"""A real `redis-server` for tests: its own free port and temp dir, no persistence, stopped and started at will.

`.ci/run` installs Debian's `redis-server` when the binary is missing; without it these tests skip.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.harness import closed_port

REDIS_SERVER = shutil.which("redis-server")


class RedisServer:
    """One redis-server process on 127.0.0.1; `stop()` and `start()` again keep the port (its data is lost)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = closed_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder)]
        args += ["--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None
