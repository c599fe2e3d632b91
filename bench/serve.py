"""One benchmark server per process: `python -m bench.serve sim|relay|proxy ...`.

Each prints `PORT <n>` (and, for the proxy, `ENGINE <name>`) once it listens, then serves
until SIGTERM. Client and servers never share an event loop or a core's GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable

from aiohttp import web

# The simulator's windows in the benchmarks: the demo's small model, a 128k one and a 1M one.
SIM_MODELS = {"sim-32k": 32000, "gpt-4o": 128000, "gpt-4.1": 1047576, "gpt-5": 400000}


async def _start(ns: argparse.Namespace) -> tuple[web.AppRunner, int, str]:
    if ns.kind == "sim":
        from proxy.demo.simulator import SimulatorConfig, start_simulator

        config = SimulatorConfig(models=dict(SIM_MODELS), chunks=ns.chunks, record_limit=8)
        runner, url = await start_simulator(config)
        return runner, int(url.rsplit(":", 1)[1].split("/")[0]), "simulator"
    if ns.kind == "long-event":
        from bench.long_event import start_upstream

        return await start_upstream()
    if ns.kind == "relay":
        from bench.relay import create_relay_app

        runner = web.AppRunner(create_relay_app(ns.upstream.removesuffix("/v1")), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, runner.addresses[0][1], "relay"
    from proxy.config.loader import ConfigHolder, load_settings
    from proxy.shell import server

    holder = ConfigHolder(load_settings(upstream_url=ns.upstream), upstream_url=ns.upstream)
    context, engine = None, "passthrough"
    if not ns.passthrough:
        from proxy.service.engine_service import build_context_service

        context, engine = build_context_service(holder), "context"
    runner, port = await server.start(holder, "127.0.0.1", 0, context=context)
    return runner, port, engine


def _profile_on_signals(loop: asyncio.AbstractEventLoop, path: str) -> None:
    """SIGUSR1 starts sampling this process's CPU (bench/cpu_sampler.py), SIGUSR2 stops it and writes `path`."""
    from pathlib import Path

    from bench.cpu_sampler import CpuSampler

    sampler: list[CpuSampler] = []

    def start() -> None:
        sampler[:] = [CpuSampler()]
        sampler[0].start()

    def stop() -> None:
        if sampler:
            sampler[0].stop()
            sampler.pop().dump(Path(path))

    loop.add_signal_handler(signal.SIGUSR1, start)
    loop.add_signal_handler(signal.SIGUSR2, stop)


async def _main(ns: argparse.Namespace) -> None:
    runner, port, engine = await _start(ns)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if ns.profile:
        _profile_on_signals(loop, ns.profile)
    print(f"PORT {port}", flush=True)
    print(f"ENGINE {engine}", flush=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serve")
    parser.add_argument("kind", choices=["sim", "relay", "proxy", "long-event"])
    parser.add_argument("--upstream", default="", help="base URL ending in /v1 (relay, proxy)")
    parser.add_argument("--chunks", type=int, default=16, help="simulator: content chunks per streamed answer")
    parser.add_argument("--passthrough", action="store_true", help="proxy: no context engine")
    parser.add_argument("--profile", metavar="FILE", help="relay, proxy: sample CPU between SIGUSR1 and SIGUSR2")
    ns = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=_loop_factory(ns.kind)) as runner:
        runner.run(_main(ns))


def _loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """asyncio's loop, as `context-proxy serve` runs; BENCH_PROXY_LOOP=uvloop / BENCH_RELAY_LOOP=uvloop in the
    environment run the proxy / the relay on uvloop's instead (issue 30's measurement; the simulator never)."""
    choice = os.environ.get({"proxy": "BENCH_PROXY_LOOP", "relay": "BENCH_RELAY_LOOP"}.get(kind, ""), "asyncio")
    if choice == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


if __name__ == "__main__":
    main(sys.argv[1:])
