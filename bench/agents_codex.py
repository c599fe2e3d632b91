"""The real Codex CLI through a long scripted session, direct and through the proxy, billed at gpt-5's prices.

`python -m bench agents` (the Codex part): Codex 0.171.0 (scripts/install_agents.sh) runs 44 shell
commands a scripted upstream asks for (tests/agents/responses_upstream.py: real commands, large
outputs, a few run twice), then answers. The upstream bills like OpenAI (o200k count, the prefix
shared with the session's last request cached in 128-token blocks) and refuses a request over its
window. Each window (200k, 32k) is run direct and through an in-process proxy whose model table
gives that window; billed input = uncached × $1.25 + cached × $0.125 per million tokens (gpt-5).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from bench.stats import table
from proxy.config.loader import ConfigHolder
from proxy.context.policy import ModelInfo
from proxy.service.engine_service import build_context_service
from proxy.shell import server
from tests.agents.agent_cli import serve_local
from tests.agents.codex_cli import run_codex
from tests.agents.responses_upstream import FINAL_PREFIX, ScriptedResponses
from tests.harness import make_settings

MODEL = "gpt-5.1-codex"
INPUT_PER_MTOK, CACHED_PER_MTOK = 1.25, 0.125  # gpt-5 (the proxy's `gpt-5*` row)
WINDOWS = (200_000, 32_000)
PROMPT = "Run the commands the model asks for, then report."
T = TypeVar("T")
_HEX = "python3 -c \"import hashlib; print('\\n'.join(hashlib.sha256(b'{}%d' % i).hexdigest() for i in range({})))\""


def commands(hex_step: int = 25, repeated: str = "seq 1 20000") -> list[str]:
    """44 commands, outputs from a few lines to Codex's own cap (~10k tokens), `repeated` run four times."""
    out: list[str] = []
    for k in range(11):
        out += [
            _HEX.format(f"file{k}", 40 + hex_step * (k % 4)),
            f"seq {k} 7 {3000 + 400 * k}",
            "ls -la /usr/lib | head -120",
        ]
        out.append(repeated if k % 3 == 0 else f"cat /etc/os-release; echo step {k}")
    return out


@dataclass
class Run:
    """One Codex run: its exit, its answer, and what the upstream billed."""

    mode: str
    window: int
    commands_total: int = 0
    prices: tuple[float, float, float] = (INPUT_PER_MTOK, CACHED_PER_MTOK, INPUT_PER_MTOK)  # input, cached, write
    returncode: int = 0
    answered: bool = False
    answer: str = ""
    requests: int = 0
    refused: int = 0
    commands_run: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    written_tokens: int = 0  # Anthropic: cache writes, inside prompt_tokens
    max_prompt: int = 0
    seconds: float = 0.0

    @property
    def cost_usd(self) -> float:
        base, cached, write = self.prices
        uncached = self.prompt_tokens - self.cached_tokens - self.written_tokens
        return (uncached * base + self.cached_tokens * cached + self.written_tokens * write) / 1e6

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "cost_usd": round(self.cost_usd, 4)}


async def start_proxy(upstream_url: str, models: tuple[ModelInfo, ...]) -> tuple[web.AppRunner, str]:
    """An in-process proxy forwarding to `upstream_url` (ending in /v1) with `models` as its table; its root URL."""
    holder = ConfigHolder(replace(make_settings(upstream_url), models=models))
    runner, port = await server.start(holder, context=build_context_service(holder))
    return runner, f"http://127.0.0.1:{port}"


async def drive(
    app: web.Application, models: tuple[ModelInfo, ...] | None, agent: Callable[[str], Awaitable[T]]
) -> tuple[T, float]:
    """Serve the scripted upstream `app`, a proxy with `models` in front of it unless None, and run `agent` on the
    root URL it should use (no /v1); what the agent returned and its seconds."""
    upstream, root = await serve_local(app)
    proxy_runner = None
    try:
        base = root
        if models is not None:
            proxy_runner, base = await start_proxy(root + "/v1", models)
        started = time.monotonic()
        return await agent(base), round(time.monotonic() - started, 1)
    finally:
        if proxy_runner is not None:
            await proxy_runner.cleanup()
        await upstream.cleanup()


async def each_window(one_run: Callable[[int, bool, Path], Awaitable[Run]], prefix: str) -> list[Run]:
    """`one_run` at every window, direct then proxied, in one temporary folder."""
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        for window in WINDOWS:
            for proxied in (False, True):
                runs.append(await one_run(window, proxied, Path(folder)))
    return runs


async def one_run(window: int, proxied: bool, folder: Path) -> Run:
    scripted = ScriptedResponses(commands(), window=window)
    row = ModelInfo(pattern=MODEL, context_window=window, input_per_mtok=INPUT_PER_MTOK)
    row = replace(row, cached_input_per_mtok=CACHED_PER_MTOK, cache_ttl_s=3600)
    mode = "proxied" if proxied else "direct"
    home, work = folder / f"home-{mode}-{window}", folder / f"work-{mode}-{window}"
    done, seconds = await drive(
        scripted.app(), (row,) if proxied else None, lambda base: run_codex(base + "/v1", PROMPT, home, work)
    )
    run = Run(mode, window, len(commands()), returncode=done.returncode, seconds=seconds)
    run.answered, run.answer = done.last_message.startswith(FINAL_PREFIX), done.last_message
    billed = scripted.answered()
    run.requests, run.refused = len(scripted.received), len(scripted.received) - len(billed)
    run.commands_run = max((_step(r.body) for r in scripted.received), default=0)
    run.prompt_tokens = sum(r.prompt_tokens for r in billed)
    run.cached_tokens = sum(r.cached_tokens for r in billed)
    run.max_prompt = max((r.prompt_tokens for r in billed), default=0)
    return run


def _step(body: dict[str, Any]) -> int:
    """How many of the script's commands the request's newest output shows run."""
    calls = [i.get("call_id", "") for i in body.get("input", []) if i.get("type") == "function_call_output"]
    return max((int(str(c).rsplit("_", 1)[-1]) + 1 for c in calls), default=0)


async def run_agents_codex() -> list[Run]:
    return await each_window(one_run, "bench-codex-")


def render(runs: list[Run]) -> str:
    rows = []
    for run in runs:
        direct = next(r for r in runs if r.window == run.window and r.mode == "direct")
        ratio = f"{run.cost_usd / direct.cost_usd:.3f}" if direct.cost_usd and run.answered and direct.answered else "-"
        rows.append(
            [
                f"{run.window // 1000}k",
                run.mode,
                f"{run.returncode}{' answered' if run.answered else ' failed'}",
                f"{run.commands_run}/{run.commands_total}",
                f"{run.requests} ({run.refused} refused)",
                f"{run.prompt_tokens:,}",
                f"{run.cached_tokens / max(1, run.prompt_tokens):.2f}",
                f"{run.max_prompt:,}",
                f"${run.cost_usd:.4f}",
                ratio,
                f"{run.seconds}",
            ]
        )
    header = [
        "window",
        "run",
        "exit",
        "commands",
        "requests",
        "input tokens",
        "cached",
        "largest",
        "input $",
        "÷ direct",
        "s",
    ]
    same = all(r.answer == d.answer for r in runs for d in runs if r.window == d.window and r.answered and d.answered)
    return table(header, rows) + f"\nSame final answer wherever both answered: {same}\n"
