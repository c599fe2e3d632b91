"""`context-proxy stats`: the dashboard's totals and sessions table, in the terminal.

It reads a running proxy's `GET /stats` and `GET /sessions` (the numbers the dashboard shows, computed
once, by the proxy) and prints them. The proxy's address and admin token come from its config, as `serve`
reads them: `[server] host`/`port` (or `--url`), and the token from the variable `[server] admin_token_env` names.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import orjson

from proxy.config.loader import DEFAULT_CONFIG, ConfigError, load_settings
from proxy.config.settings import Settings

TIMEOUT_S = 10.0
MAX_ROWS = 50  # the most recent sessions shown; the totals cover every one


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="context-proxy stats",
        description="What a running proxy saved: its totals and its sessions, most recent first.",
    )
    parser.add_argument("--url", help="the proxy's address (default: http://[server] host:port of --config)")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"the proxy's proxy.toml: its address, its admin token variable (default: the packaged {DEFAULT_CONFIG})",
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.config)
        url = (args.url or _address(settings)).rstrip("/")
        headers = _auth(settings)
        stats, rows = _get(url, "/stats", headers), _get(url, "/sessions", headers)
    except (ConfigError, StatsError) as exc:
        print(f"context-proxy stats: {exc}", file=sys.stderr)
        return 1
    print(render(url, stats, rows, now=time.time()))
    return 0


class StatsError(Exception):
    """The proxy could not be read: one line saying why."""


def _address(settings: Settings) -> str:
    host = settings.server.host
    host = "127.0.0.1" if host in ("0.0.0.0", "") else "[::1]" if host == "::" else host
    return f"http://{host}:{settings.server.port}"


def _auth(settings: Settings) -> dict[str, str]:
    env = settings.server.admin_token_env
    if not env:
        return {}
    token = os.environ.get(env, "").strip()
    if not token:
        raise StatsError(f"the variable {env} ([server] admin_token_env in {settings.path}) is not set")
    return {"Authorization": f"Bearer {token}"}


def _get(url: str, path: str, headers: dict[str, str]) -> Any:
    request = urllib.request.Request(url + path, headers={**headers, "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise StatsError(f"{url}{path} answered {exc.code}: {_message(exc.read())}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StatsError(f"cannot reach the proxy at {url}: {reason}") from None
    except orjson.JSONDecodeError:
        raise StatsError(f"{url}{path} did not answer JSON: is that a context-proxy?") from None


def _message(body: bytes) -> str:
    try:
        return str(orjson.loads(body)["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")


def usd(value: float) -> str:
    """Dollars as the dashboard writes them: 4 decimals under $10, else 2."""
    return f"{'-' if value < 0 else ''}${abs(value):.{4 if abs(value) < 10 else 2}f}"


def ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def render(url: str, stats: dict[str, Any], rows: list[dict[str, Any]], *, now: float) -> str:
    """The totals, then one line per session (at most MAX_ROWS, the most recent)."""
    t = stats["totals"]
    direct = t["direct_cost_usd"]
    share = f" ({t['saved_usd'] / direct:.1%} of direct)" if direct else ""
    hits = "-" if t["cache_hit_rate"] is None else f"{t['cache_hit_rate']:.1%}"
    lines = [
        f"context-proxy {stats.get('version', '?')} at {url}: {t['sessions']} sessions, {t['turns']} turns",
        f"  saved       {usd(t['saved_usd'])}{share}",
        f"  billed      {usd(t['cost_usd'])}, direct {usd(direct)}",
        f"  tokens      {t['tokens_before_total']:,} sent by clients -> {t['tokens_after_total']:,} upstream",
        f"  cache hits  {hits} of billed prompt tokens",
        f"  overflows   {t['overflows_rescued']} rescued",
        f"  recall      {t['recall_misses']} misses",
        "",
    ]
    head = ("session", "api", "model", "turns", "billed", "direct", "saved", "epochs", "last seen")
    table = [head] + [
        (
            str(r["id"])[:40],
            str(r.get("api") or "-"),
            str(r.get("model") or "-")[:30],
            str(r["turns"]),
            usd(r["cost_usd"]),
            usd(r["direct_cost_usd"]),
            usd(r["saved_usd"]),
            str(r.get("epochs", 0)),
            ago(now - r["last_seen"]),
        )
        for r in rows[:MAX_ROWS]
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    left = {0, 1, 2}  # text columns; the figures are right-aligned
    for row in table:
        cells = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    if len(rows) > MAX_ROWS:
        lines.append(f"... and {len(rows) - MAX_ROWS} older sessions (in the totals above)")
    if not rows:
        lines.append("(no sessions yet)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
