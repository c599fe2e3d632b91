"""Every benchmark at toy sizes, in seconds: it runs and its report has the expected shape (CI's check)."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

from bench import ab, memory, overhead, profile, savings, scaling, stall
from bench.procs import ROOT, Servers


def run_smoke() -> dict[str, Any]:
    out: dict[str, Any] = {}
    with Servers() as servers:  # memory first: it wants servers that have served nothing yet
        out["memory"] = asyncio.run(
            memory.run_memory(
                sessions=1,
                tokens=3000,
                streams=2,
                stream_bytes=64 * 1024,
                requests=40,
                stream_delay_ms=5,
                servers=servers,
            )
        )
        out["overhead"] = asyncio.run(
            overhead.run_overhead(n=3, n_concurrent=8, concurrency=4, rounds=1, servers=servers)
        )
    out["scaling"] = scaling.run_scaling(sizes=(2000, 4000), warm_turns=2, firsts=1)
    out["savings"] = asyncio.run(savings.run_savings(["sweagent_marshmallow-1867.json"], limit=3, plot=False))
    out["stall"] = asyncio.run(stall.run_stall(rounds=1, size=70_000))  # ~290 KB: over scheduling.INLINE_COST
    if (ROOT / ".git").exists():  # ab unpacks a commit with `git archive`: a checkout, not an unpacked sdist
        out["ab"] = ab.run_ab("HEAD", n=16, rounds=2)
    if importlib.util.find_spec("pyinstrument") is not None:  # a bench-only dependency: CI may not have it
        out["profile"] = profile.run_profile(tokens=3000, turns=3, write=False)
    return out


def render(result: dict[str, Any]) -> str:
    renderers = {
        "memory": memory.render,
        "overhead": overhead.render,
        "scaling": scaling.render,
        "savings": savings.render,
        "profile": profile.render,
        "stall": stall.render,
        "ab": ab.render,
    }
    return "\n\n".join(f"## {name}\n{renderers[name](part)}" for name, part in result.items())
