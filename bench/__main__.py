"""`python -m bench KIND [--json FILE]`: run one benchmark and print its table."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson


def _overhead(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import overhead

    return asyncio.run(overhead.run_overhead(n=ns.n or 600, n_concurrent=(ns.n or 600) * 4)), overhead.render


def _scaling(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import scaling

    return scaling.run_scaling(warm_turns=ns.n or 9), scaling.render


COMMANDS: dict[str, Callable[[argparse.Namespace], tuple[Any, Callable[[Any], str]]]] = {
    "overhead": _overhead,
    "scaling": _scaling,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("kind", choices=sorted(COMMANDS))
    parser.add_argument("-n", type=int, default=0, help="requests or turns per measurement (default: each's own)")
    parser.add_argument("--json", metavar="FILE", help="also write the raw result as JSON")
    ns = parser.parse_args(argv)
    started = time.monotonic()
    result, render = COMMANDS[ns.kind](ns)
    print(render(result))
    print(f"\n({ns.kind} finished in {time.monotonic() - started:.1f} s)")
    if ns.json:
        Path(ns.json).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
