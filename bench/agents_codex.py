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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.stats import table
from proxy.config.loader import ConfigHolder
from proxy.context.policy import ModelInfo
from proxy.service.engine_service import build_context_service
from proxy.shell import server
from tests.agents.codex_cli import run_codex
from tests.agents.responses_upstream import FINAL_PREFIX, ScriptedResponses
from tests.harness import make_settings

MODEL = "gpt-5.1-codex"
INPUT_PER_MTOK, CACHED_PER_MTOK = 1.25, 0.125  # gpt-5 (the proxy's `gpt-5*` row)
WINDOWS = (200_000, 32_000)
PROMPT = "Run the commands the model asks for, then report."
_HEX = "python3 -c \"import hashlib; print('\\n'.join(hashlib.sha256(b'{}%d' % i).hexdigest() for i in range({})))\""


def commands() -> list[str]:
    """44 commands, outputs from a few lines to Codex's own cap (~10k tokens), some of them run twice."""
    out: list[str] = []
    for k in range(11):
        out += [
            _HEX.format(f"file{k}", 40 + 25 * (k % 4)),
            f"seq {k} 7 {3000 + 400 * k}",
            "ls -la /usr/lib | head -120",
        ]
        out.append("seq 1 20000" if k % 3 == 0 else f"cat /etc/os-release; echo step {k}")
    return out


@dataclass
class Run:
    """One Codex run: its exit, its answer, and what the upstream billed."""

    mode: str
    window: int
    returncode: int = 0
    answered: bool = False
    answer: str = ""
    requests: int = 0
    refused: int = 0
    commands_run: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    max_prompt: int = 0
    seconds: float = 0.0

    @property
    def cost_usd(self) -> float:
        uncached = self.prompt_tokens - self.cached_tokens
        return (uncached * INPUT_PER_MTOK + self.cached_tokens * CACHED_PER_MTOK) / 1e6

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "cost_usd": round(self.cost_usd, 4)}


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"


async def one_run(window: int, proxied: bool, folder: Path) -> Run:
    scripted = ScriptedResponses(commands(), window=window)
    upstream, url = await _serve(scripted.app())
    proxy_runner = None
    try:
        base = url
        if proxied:
            settings = make_settings(url)
            row = ModelInfo(pattern=MODEL, context_window=window, input_per_mtok=INPUT_PER_MTOK)
            settings = replace(
                settings, models=(replace(row, cached_input_per_mtok=CACHED_PER_MTOK, cache_ttl_s=3600),)
            )
            holder = ConfigHolder(settings)
            proxy_runner, port = await server.start(holder, context=build_context_service(holder))
            base = f"http://127.0.0.1:{port}/v1"
        mode = "proxied" if proxied else "direct"
        started = time.monotonic()
        done = await run_codex(base, PROMPT, folder / f"home-{mode}-{window}", folder / f"work-{mode}-{window}")
        run = Run(mode, window, done.returncode, done.last_message.startswith(FINAL_PREFIX), done.last_message)
        run.seconds = round(time.monotonic() - started, 1)
    finally:
        if proxy_runner is not None:
            await proxy_runner.cleanup()
        await upstream.cleanup()
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
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench-codex-") as folder:
        for window in WINDOWS:
            for proxied in (False, True):
                runs.append(await one_run(window, proxied, Path(folder)))
    return runs


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
                f"{run.commands_run}/{len(commands())}",
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
