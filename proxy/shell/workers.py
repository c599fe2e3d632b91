"""`context-proxy serve --workers N`: N processes on one port, each with its own event loop.

Each worker is the same `serve` command bound with SO_REUSEPORT, so the kernel spreads new
connections over them; this parent only starts them, restarts one that dies, and passes
SIGINT/SIGTERM on. Sessions are shared through Redis (`[state] redis_url`): without it, two
turns of one conversation would land on workers that each know half of it, so the command
refuses to start.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from types import FrameType

from proxy.config.loader import ConfigError
from proxy.config.settings import Settings
from proxy.metrics import SHARED_DIR_ENV

log = logging.getLogger("proxy.workers")

RESTART_AFTER_S = 1.0  # a worker that died is started again no sooner than this after its last start
START_FAILED_S = 5.0  # a worker that exits with an error this soon after its start failed to start: stop all
_POLL_S = 0.2
PARENT_ENV = "CONTEXT_PROXY_WORKER_OF"  # set in each worker's environment: the pid of the parent it serves for
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def check_workers(workers: int, settings: Settings, port: int, passthrough: bool) -> None:
    """Raise ConfigError (the CLI's exit 2, one line) when N workers could not serve as one proxy."""
    if workers < 1:
        raise ConfigError(f"--workers {workers}: should be 1 or more")
    if port == 0:
        raise ConfigError(f"--workers {workers}: needs a fixed --port (each worker would bind its own free port)")
    if not settings.state.redis_url and not passthrough:
        raise ConfigError(
            f"--workers {workers}: each worker is its own process and only Redis shares sessions between them; "
            "set [state] redis_url (or run one worker)"
        )


@contextlib.contextmanager
def shared_metrics() -> Iterator[None]:
    """The workers started meanwhile keep their metrics in one folder, so each answers /metrics for all
    (proxy/metrics.py); it is removed when they are all done."""
    with tempfile.TemporaryDirectory(prefix="context-proxy-metrics-") as folder:
        before = os.environ.get(SHARED_DIR_ENV)
        os.environ[SHARED_DIR_ENV] = folder  # inherited by every worker, restarted ones too
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(SHARED_DIR_ENV, None)
            else:
                os.environ[SHARED_DIR_ENV] = before


def die_with_parent() -> None:
    """In a worker (`PARENT_ENV` set): SIGTERM when the parent dies, however it dies (a SIGKILLed parent cannot
    pass its signal on, and its workers would go on serving beside the next instance on the same port).

    Linux: `prctl(PR_SET_PDEATHSIG)`, then a check that the parent did not die before it; elsewhere a thread
    that looks at the parent pid every second.
    """
    parent = os.environ.pop(PARENT_ENV, "")
    if not parent.isdigit():
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None
    if libc is None or libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        threading.Thread(target=_watch_parent, args=(int(parent),), name="parent-watch", daemon=True).start()
    if os.getppid() != int(parent):  # it died before the prctl: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def run_workers(workers: int, argv: list[str]) -> int:
    """Run `python -m proxy <argv>` N times until SIGINT/SIGTERM; a worker that exits is restarted."""
    command = [sys.executable, "-m", "proxy", *argv]
    os.environ[PARENT_ENV] = str(os.getpid())  # each worker dies with this process (`die_with_parent`)
    stopping = False

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = [time.monotonic()] * workers
    procs = [subprocess.Popen(command) for _ in range(workers)]
    log.info("%d workers serving (pids %s)", workers, " ".join(str(p.pid) for p in procs))
    status = 0
    try:
        while not stopping and not status:
            time.sleep(_POLL_S)
            for i, proc in enumerate(procs):
                code, age = proc.poll(), time.monotonic() - started[i]
                if code is None or stopping or age < RESTART_AFTER_S:
                    continue
                if code in (1, 2) and age < START_FAILED_S:  # it said why (port taken, config): no point retrying
                    status = code
                    break
                log.error("worker %d (pid %d) exited with %s; starting it again", i, proc.pid, code)
                procs[i], started[i] = subprocess.Popen(command), time.monotonic()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status
