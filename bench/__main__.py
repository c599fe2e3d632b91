"""`python -m bench overhead|scaling|memory|savings|responses|anthropic|profile|request-profile|stall|stall-items|ab`
`|smoke|quality|hindsight|epoch-rule|idle|long-event|bodies|state|slow-clients|compaction|agents-codex|agents-claude|fleet`
`|frontier|reach|agent-turns|fresh-turns|agent-messages|decisions`
`[-n N] [--ref REV] [--json FILE]`.

Runs one benchmark and prints its table.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

Runner = Callable[[argparse.Namespace], tuple[Any, Callable[[Any], str]]]


def _overhead(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import overhead

    n = ns.n or 600
    return asyncio.run(overhead.run_overhead(n=n, n_concurrent=n * 4)), overhead.render


def _scaling(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import scaling

    return scaling.run_scaling(warm_turns=ns.n or 9, api=ns.api), scaling.render


def _memory(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import memory

    return asyncio.run(memory.run_memory(requests=ns.n or 10_000)), memory.render


def _savings(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import savings

    return asyncio.run(savings.run_savings(limit=ns.n or None)), savings.render


def _responses(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import responses

    return asyncio.run(responses.run_responses(limit=ns.n or None)), responses.render


def _anthropic(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import anthropic

    return asyncio.run(anthropic.run_anthropic()), anthropic.render


def _profile(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import profile

    return profile.run_profile(turns=ns.n or 60), profile.render


def _request_profile(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import request_profile

    return request_profile.run_request_profile(n=ns.n or 1600), request_profile.render


def _stall(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import stall

    return asyncio.run(stall.run_stall(rounds=ns.n or 3)), stall.render


def _stall_items(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import stall_items

    return asyncio.run(stall_items.run_stall_items(ns.ref)), stall_items.render


def _ab(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import ab

    return ab.run_ab(ns.ref or "HEAD~1", n=ns.n or 800), ab.render


def _smoke(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import smoke

    return smoke.run_smoke(), smoke.render


def _long_event(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import long_event

    return long_event.run_long_event([ns.n] if ns.n else [40, 80], ns.ref), long_event.render


def _bodies(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import bodies

    return asyncio.run(bodies.run_bodies(concurrent=ns.n or 8)), bodies.render


def _slow_clients(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import slow_clients

    return slow_clients.run_slow_clients(), slow_clients.render


def _fleet(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import fleet

    if ns.api == "responses":
        raise SystemExit("fleet: --api chat or messages")
    measured = tuple(ns.set) if ns.set else ("tuned", "held-out")
    discount = 0.1 if ns.discount is None else ns.discount
    return asyncio.run(fleet.run_fleet(discount, measured=measured, api=ns.api, behind=ns.behind)), fleet.render


def _hindsight(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import hindsight
    from bench.quality import named_sets

    return hindsight.run_hindsight(named_sets(ns.set) if ns.set else None), hindsight.render


def _epoch_rule(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import epoch_rule

    return epoch_rule.run_epoch_rule(), epoch_rule.render


def _idle(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import idle

    return asyncio.run(idle.run_idle()), idle.render


def _quality(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import quality

    return quality.run_quality(sets=quality.named_sets(ns.set or None), only=ns.setting or None), quality.render


def _frontier(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import frontier, quality

    sets = quality.named_sets(ns.set or None)
    return frontier.run_frontier(sets=sets, only=ns.setting or None), frontier.render


def _reach(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import quality, reach

    return reach.run_reach(sets=quality.named_sets(ns.set) if ns.set else None), reach.render


def _compaction(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import compaction

    return compaction.run_compaction(), compaction.render


def _agents_codex(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import agents_codex

    return asyncio.run(agents_codex.run_agents_codex()), agents_codex.render


def _agents_claude(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import agents_claude, agents_codex

    return asyncio.run(agents_claude.run_agents_claude()), agents_codex.render


def _state(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import state

    return state.run_state(turns=ns.n or None), state.render


def _decisions(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import decisions

    return decisions.run_decisions(), decisions.render


def _agent_turns(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import agent_turns

    return agent_turns.run_agent_turns(copies=ns.n or 6), agent_turns.render


def _fresh_turns(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import fresh_turns

    return fresh_turns.run_fresh_turns(passes=ns.n or 5), fresh_turns.render


def _agent_messages(ns: argparse.Namespace) -> tuple[Any, Callable[[Any], str]]:
    from bench import agent_messages

    return agent_messages.run_agent_messages(ns.set), agent_messages.render


COMMANDS: dict[str, Runner] = {
    "overhead": _overhead,
    "agent-turns": _agent_turns,
    "fresh-turns": _fresh_turns,
    "agent-messages": _agent_messages,
    "scaling": _scaling,
    "memory": _memory,
    "savings": _savings,
    "responses": _responses,
    "agents-codex": _agents_codex,
    "agents-claude": _agents_claude,
    "anthropic": _anthropic,
    "profile": _profile,
    "request-profile": _request_profile,
    "stall": _stall,
    "stall-items": _stall_items,
    "ab": _ab,
    "smoke": _smoke,
    "quality": _quality,
    "hindsight": _hindsight,
    "fleet": _fleet,
    "epoch-rule": _epoch_rule,
    "idle": _idle,
    "long-event": _long_event,
    "bodies": _bodies,
    "slow-clients": _slow_clients,
    "state": _state,
    "compaction": _compaction,
    "frontier": _frontier,
    "reach": _reach,
    "decisions": _decisions,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("kind", choices=list(COMMANDS))
    parser.add_argument(
        "-n",
        type=int,
        default=0,
        help="requests (overhead, memory; ab: per block), warm turns (scaling, profile), turns (savings), "
        "passes (fresh-turns), MB (long-event)",
    )
    parser.add_argument(
        "--ref",
        default=None,
        help="ab (default HEAD~1), long-event, stall-items: the git revision to compare the working tree with",
    )
    parser.add_argument(
        "--api",
        choices=["chat", "messages", "responses"],
        default="chat",
        help="fleet: chat completions at d x input, or Messages as Claude Code sends it (breakpoints on system + "
        "last message, the shipped Claude prices: reads 0.1x, writes 1.25x); scaling: chat, Messages as Claude "
        "Code sends it, or Responses as Codex does",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the raw result as JSON")
    parser.add_argument(
        "--set",
        action="append",
        help="quality, hindsight, frontier, reach: only this set (repeatable), e.g. 'others A'; fleet: tuned, "
        "held-out, held-out-c, others-tuned, others-held-out (the history pass then serves others A too)",
    )
    parser.add_argument("--discount", type=float, help="fleet: d, the cached price ÷ the input price (0.1)")
    parser.add_argument(
        "--behind",
        type=float,
        help="fleet: [policy] bet_overrun for this run (the cap on a bet on the agent's history, shipped 0.1): how far "
        "above its direct bill so far a session ending on an edit's turn may be",
    )
    parser.add_argument(
        "--setting",
        action="append",
        help="quality, frontier: only this setting (repeatable), e.g. 'direct'; frontier always adds its oracle "
        "(lost vs billed at 128k, d = 1 and 0.5, knowing the agent's next messages)",
    )
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
