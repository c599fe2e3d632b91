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

    def start(self, extra: list[str] | None = None) -> None:
        assert REDIS_SERVER is not None
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder)]
        args += ["--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning", *(extra or [])]
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


REDIS_CLI = shutil.which("redis-cli")


class RedisCluster:
    """A real three-node Redis Cluster on 127.0.0.1 (no replicas): every slot served, as `redis-cli --cluster create`
    lays them out; `url` names its first node, as a client configured for a cluster would."""

    def __init__(self, folder: Path, nodes: int = 3) -> None:
        self.nodes = [RedisServer(folder / f"node-{i}") for i in range(nodes)]
        for node in self.nodes:
            node.port = _port_with_bus()

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> None:
        for node in self.nodes:
            node.folder.mkdir(parents=True, exist_ok=True)
            node.start(["--cluster-enabled", "yes", "--cluster-config-file", str(node.folder / "nodes.conf")])
        assert REDIS_CLI is not None
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        create = [REDIS_CLI, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"]
        subprocess.run(create, check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # every node agrees the cluster is up before a test uses it
            states = [self.cli(n, "cluster", "info") for n in self.nodes]
            if all("cluster_state:ok" in s for s in states):
                return
            time.sleep(0.1)
        raise RuntimeError("the Redis Cluster did not come up")

    def cli(self, node: RedisServer, *command: str) -> str:
        assert REDIS_CLI is not None
        args = [REDIS_CLI, "-p", str(node.port), *command]
        return subprocess.run(args, check=True, capture_output=True, text=True, timeout=10).stdout

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _port_with_bus() -> int:
    """A free port whose cluster bus port (the port + 10000) is free and valid too: an ephemeral port often is not."""
    for _ in range(100):
        port = closed_port()
        if port + 10000 > 65535:
            port -= 20000  # ephemeral ports start at 32768: this one is below them, its bus port too
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")
