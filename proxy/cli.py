"""`context-proxy serve|demo|simulate|wrap|stats`: the command line (also `python -m proxy`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from proxy import __version__
from proxy.config.loader import DEFAULT_CONFIG, ConfigError, ConfigHolder, load_settings
from proxy.config.schema import Source, validate
from proxy.config.settings import ServerConfig, Settings
from proxy.metrics import share_from_env
from proxy.shell.log_hygiene import guard_handlers

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str = "INFO") -> None:
    """Log lines name routes, statuses and sizes; keys and prompt text never appear in them."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    guard_handlers(logging.getLogger())  # every line: control characters escaped, no client header bytes
    # aiohttp's client logs nothing useful at INFO; its access log is replaced by proxy.shell.access.
    logging.getLogger("aiohttp").setLevel(max(logging.WARNING, logging.getLogger().level))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="context-proxy",
        description="A streaming reverse proxy for OpenAI-style APIs that keeps agent conversations "
        "inside the model's window without breaking the prompt cache.",
    )
    parser.add_argument("--version", action="version", version=f"context-proxy {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run the proxy (default)",
        description=f"Serve the proxy. Without arguments: {DEFAULT_CONFIG}, 127.0.0.1:8787.",
    )
    serve.add_argument("--config", metavar="FILE", help=f"proxy.toml to load (default: the packaged {DEFAULT_CONFIG})")
    serve.add_argument("--host", help="address to bind (default: [server] host)")
    serve.add_argument("--port", help="port to bind, 0 for any free one (default: [server] port)")
    serve.add_argument("--upstream", metavar="URL", help="upstream base URL, e.g. https://api.openai.com/v1")
    serve.add_argument(
        "--anthropic-upstream", metavar="URL", help="Anthropic base URL, without /v1 (default: [anthropic] base_url)"
    )
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.add_argument("--passthrough", action="store_true", help="forward chat bodies unchanged (no context engine)")
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="N processes on one port, each its own event loop (needs [state] redis_url when N > 1)",
    )
    serve.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # set by --workers for each
    commands.add_parser(
        "demo",
        add_help=False,
        help="replay an agent trace against a local simulated upstream, direct and through the proxy",
    )
    commands.add_parser(
        "simulate",
        add_help=False,
        help="serve the local simulated upstream (try the proxy with curl and no API key)",
    )
    commands.add_parser(
        "wrap",
        add_help=False,
        help="run an agent CLI through the proxy (`wrap codex [ARGS...]`), starting one if none is running",
    )
    commands.add_parser("stats", add_help=False, help="what a running proxy saved: its totals and sessions")
    return parser


def _context_service(holder: ConfigHolder, passthrough: bool):  # -> ContextService | None
    if passthrough:
        return None
    try:
        from proxy.service.engine_service import build_context_service
    except ImportError as exc:  # a partial install: still a working proxy, and say so loudly
        logging.getLogger("proxy.cli").error("context engine unavailable (%s); chat bodies pass unchanged", exc)
        return None
    return build_context_service(holder)


def _bind_address(args: argparse.Namespace, settings: Settings) -> tuple[str, int]:
    """--host/--port over [server]; a port is checked like the config's."""
    if args.port is None:
        return args.host or settings.server.host, settings.server.port
    try:
        port = int(args.port)
    except ValueError:
        raise ConfigError(f"--port: should be an integer from 0 to 65535, not {args.port!r}") from None
    validate(ServerConfig, {"port": port}, Source(Path("--port")), [])
    return args.host or settings.server.host, port


def check_startup(settings: Settings) -> None:
    """A key variable the config names but the environment lacks would fail every request: refuse to start."""
    for section, key, consequence in (
        ("upstream", "api_key_env", "every request would be refused with 502"),
        ("anthropic", "api_key_env", "every Anthropic request would be refused with 502"),
        ("auth", "keys_env", "the proxy would be open to anyone"),
    ):
        name = getattr(getattr(settings, section), key)
        if name and not os.environ.get(name, "").strip():
            where = Source(Path(settings.path), Path(settings.path).read_text(encoding="utf-8"))
            raise where.error([section], key, f"the variable {name} is not set; {consequence}")


def run_serve(args: argparse.Namespace) -> int:
    from proxy.shell.server import ListenError, serve
    from proxy.shell.workers import die_with_parent

    die_with_parent()  # a worker of `--workers N` (no-op otherwise): it ends when its parent does
    setup_logging(args.log_level)
    log = logging.getLogger("proxy.cli")
    try:
        settings = load_settings(args.config, args.upstream, args.anthropic_upstream)
        host, port = _bind_address(args, settings)
        check_startup(settings)
        if args.workers != 1:
            return _run_workers(args, settings, port)
        holder = ConfigHolder(settings, args.upstream)
        context = _context_service(holder, args.passthrough)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    if args.passthrough:
        log.warning("--passthrough: chat bodies are forwarded unchanged, the context engine is off")
    share_from_env()  # one of `--workers N`: /metrics adds up every worker's
    try:
        serve(holder, host, port, context=context, reuse_port=args.reuse_port)
    except ListenError as exc:
        log.error("%s", exc)
        return 1
    finally:
        if context is not None:
            context.close()
    return 0


def _run_workers(args: argparse.Namespace, settings: Settings, port: int) -> int:
    """`--workers N`: N `serve` processes sharing the port; refused (ConfigError) when they would not share sessions."""
    from proxy.shell.workers import check_workers, run_workers, shared_metrics

    check_workers(args.workers, settings, port, args.passthrough)
    with shared_metrics():
        return run_workers(args.workers, worker_argv(args.argv))


def worker_argv(argv: list[str]) -> list[str]:
    """The command line of one worker: the same `serve`, without --workers, on a shared port."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            out.append(arg)
    return [*(out if out[:1] == ["serve"] else ["serve", *out]), "--reuse-port"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:  # the demo parses its own arguments (and its own --help)
        from proxy.demo import replay  # imported lazily: it pulls in the simulator and the engine

        return replay.main(argv[1:]) or 0
    if argv[:1] == ["simulate"]:
        from proxy.demo import replay

        return replay.simulate_main(argv[1:])
    if argv[:1] == ["wrap"]:  # the agent's own arguments follow: wrap parses what precedes them
        from proxy.wrap import launch

        return launch.main(argv[1:])
    if argv[:1] == ["stats"]:
        from proxy import stats_command

        return stats_command.main(argv[1:])
    args = build_parser().parse_args(argv or ["serve"])
    args.argv = argv
    return run_serve(args)


if __name__ == "__main__":
    sys.exit(main())
