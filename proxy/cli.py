"""`context-proxy serve|demo|simulate`: the command line (also `python -m proxy`)."""

from __future__ import annotations

import argparse
import logging
import sys

from proxy.config import DEFAULT_CONFIG, ConfigError, ConfigHolder, load_settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str = "INFO") -> None:
    """Log lines name routes, statuses and sizes; keys and prompt text never appear in them."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    # aiohttp's client logs nothing useful at INFO; its access log is replaced by proxy.access.
    logging.getLogger("aiohttp").setLevel(max(logging.WARNING, logging.getLogger().level))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="context-proxy",
        description="A streaming reverse proxy for OpenAI-style APIs that keeps agent conversations "
        "inside the model's window without breaking the prompt cache.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run the proxy (default)",
        description=f"Serve the proxy. Without arguments: {DEFAULT_CONFIG}, 127.0.0.1:8787.",
    )
    serve.add_argument("--config", metavar="FILE", help=f"proxy.toml to load (default: the packaged {DEFAULT_CONFIG})")
    serve.add_argument("--host", help="address to bind (default: [server] host)")
    serve.add_argument("--port", type=int, help="port to bind (default: [server] port)")
    serve.add_argument("--upstream", metavar="URL", help="upstream base URL, e.g. https://api.openai.com/v1")
    serve.add_argument(
        "--anthropic-upstream", metavar="URL", help="Anthropic base URL, without /v1 (default: [anthropic] base_url)"
    )
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.add_argument("--passthrough", action="store_true", help="forward chat bodies unchanged (no context engine)")
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
    return parser


def _context_service(holder: ConfigHolder, passthrough: bool):  # -> ContextService | None
    if passthrough:
        return None
    try:
        from proxy.service import build_context_service
    except ImportError as exc:  # a partial install: still a working proxy, and say so loudly
        logging.getLogger("proxy.cli").error("context engine unavailable (%s); chat bodies pass unchanged", exc)
        return None
    return build_context_service(holder)


def run_serve(args: argparse.Namespace) -> int:
    from proxy.server import serve

    setup_logging(args.log_level)
    try:
        settings = load_settings(args.config, args.upstream, args.anthropic_upstream)
        holder = ConfigHolder(settings, args.upstream)
        context = _context_service(holder, args.passthrough)
    except ConfigError as exc:
        logging.getLogger("proxy.cli").error("%s", exc)
        return 2
    host = args.host or settings.server.host
    port = args.port if args.port is not None else settings.server.port
    serve(holder, host, port, context=context)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:  # the demo parses its own arguments (and its own --help)
        from proxy import demo  # imported lazily: it pulls in the simulator and the engine

        return demo.main(argv[1:]) or 0
    if argv[:1] == ["simulate"]:
        from proxy import demo

        return demo.simulate_main(argv[1:])
    return run_serve(build_parser().parse_args(argv or ["serve"]))


if __name__ == "__main__":
    sys.exit(main())
