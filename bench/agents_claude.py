"""The real Claude Code through a long scripted session, direct and through the proxy, billed at its model's prices.

`python -m bench agents-claude`: Claude Code 2.1.332 (scripts/install_agents.sh) with its default
model runs 44 Bash commands a scripted upstream asks for (tests/agents/messages_upstream.py: signed
thinking, real commands, outputs up to ~8k tokens, a few run twice; an Agent call at step 22 whose
subagent runs 4 commands of its own), then answers. The upstream bills as Anthropic does (cache
reads and writes by the request's breakpoints, Claude's count as tiktoken's x 1.12) and refuses a
prompt over its window. Each window (200k, 32k) is run direct and through an in-process proxy
whose model table is the packaged one with that window; billed input = uncached x input price +
cache writes x write price + cache reads x cached price, from the packaged row of the model
(claude-opus-5-5: $4.00, writes $5.00 = 1.25x, reads $0.20 = 0.05x per million tokens). Claude
Code's output reserve is 8,000 tokens (CLAUDE_CODE_MAX_OUTPUT_TOKENS, as in tests/agents).
"""

from __future__ import annotations

from pathlib import Path

from bench.agents_codex import _HEX, Run, drive, each_window
from bench.agents_codex import commands as codex_commands
from proxy.config.loader import packaged_models
from proxy.config.settings import Settings
from tests.agents.claude_cli import DEFAULT_MODEL, ClaudeRun, claude_rows, run_claude
from tests.agents.messages_upstream import FINAL_PREFIX, MAIN, ScriptedMessages, step_of

WINDOWS = (200_000, 32_000)
PROMPT = "Run the commands the model asks for, then report."
AGENT_AT = 22
RUN_TIMEOUT_S = 240


def commands() -> list[str]:
    """44 commands (agents-codex's shape), outputs from a few lines to ~8k tokens, some of them run twice."""
    return codex_commands(hex_step=45, repeated="seq 1 2500")


SUBAGENT_COMMANDS = (_HEX.format("sub", 120), "seq 1 1500", "ls -la /usr/bin | head -80", "echo subagent done")


async def _claude(base: str, home: Path, work: Path) -> ClaudeRun:
    """A run, or its failure when it does not end within RUN_TIMEOUT_S (killed: exit -9)."""
    try:
        return await run_claude(base, PROMPT, home, work, timeout_s=RUN_TIMEOUT_S)
    except TimeoutError:
        return ClaudeRun(-9, {}, f"killed after {RUN_TIMEOUT_S} s", set())


def _prices() -> tuple[float, float, float]:
    row = Settings(models=packaged_models()).model(DEFAULT_MODEL)
    return row.input_per_mtok, row.cached_input_per_mtok, row.write_price


async def one_run(window: int, proxied: bool, folder: Path) -> Run:
    scripted = ScriptedMessages(commands(), SUBAGENT_COMMANDS, AGENT_AT, window=window)
    mode = "proxied" if proxied else "direct"
    home, work = folder / f"home-{mode}-{window}", folder / f"work-{mode}-{window}"
    done, seconds = await drive(
        scripted.app(), claude_rows(window) if proxied else None, lambda base: _claude(base, home, work)
    )
    run = Run(mode, window, len(commands()), _prices(), returncode=done.returncode, seconds=seconds)
    run.answered, run.answer = done.answer.startswith(FINAL_PREFIX), done.answer
    billed = scripted.answered()
    run.requests, run.refused = len(scripted.received), len(scripted.received) - len(billed)
    steps = max((step_of(r.body, MAIN) for r in scripted.received if r.kind == MAIN), default=0)
    run.commands_run = steps - (steps > AGENT_AT)  # the Agent call is a step, not a command
    run.prompt_tokens = sum(r.prompt_tokens for r in billed)
    run.cached_tokens = sum(r.usage["cache_read_input_tokens"] for r in billed)
    run.written_tokens = sum(r.usage["cache_creation_input_tokens"] for r in billed)
    run.max_prompt = max((r.prompt_tokens for r in billed), default=0)
    return run


async def run_agents_claude() -> list[Run]:
    return await each_window(one_run, "bench-claude-")
