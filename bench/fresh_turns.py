"""The engine's CPU on agent turns of sessions that are new: what `bench agent-turns` hides.

`bench agent-turns` replays six copies of each packaged run, so from the second copy on the recall memos hold
every text. Here the packaged runs are replayed in this process (`bench.engine.handle`, as the server parses and
prepares each request) as new sessions, pass after pass, with the recall memos (`TOKEN_SETS`, the chunk table)
emptied before each pass: each pass costs what a session never seen before costs. To compare two commits, run it
in a checkout of each, one after the other, a few times (`PYTHONPATH=CHECKOUT python -m bench fresh-turns`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.agent_turns import runs as agent_runs
from bench.engine import handle, service
from proxy.context import recall
from proxy.demo.traces import list_traces


def _forget_recall() -> None:
    """Empty the process-wide recall memos, as a process that never saw these texts has them."""
    budget = recall.TOKEN_SETS.max_bytes
    recall.TOKEN_SETS.fit(0)
    recall.TOKEN_SETS.fit(budget)
    getattr(recall, "_CHUNKS", {}).clear()  # (absent before 5816cd0: this file also runs in older checkouts)


def run_fresh_turns(passes: int = 5) -> dict[str, Any]:
    runs = agent_runs(stream=False)  # `bench agent-turns`' bodies: gpt-4.1, a 1M window, nothing truncated
    svc = service()
    turns = sum(len(bodies) for bodies in runs)

    def play(tag: str) -> float:
        _forget_recall()
        started = time.process_time()
        for k, bodies in enumerate(runs):
            for body in bodies:
                handle(svc, body, f"{tag}-{k}")
        return (time.process_time() - started) * 1e3 / turns

    play("warm-up")
    per_pass = [play(f"pass-{p}") for p in range(passes)]
    return {"traces": list_traces(), "turns": turns, "ms_per_turn": per_pass, "median": statistics.median(per_pass)}


def render(result: dict[str, Any]) -> str:
    passes = ", ".join(f"{x:.3f}" for x in result["ms_per_turn"])
    return (
        f"fresh agent turns: the packaged runs ({result['turns']} turns a pass) as new sessions, recall memos emptied "
        f"before each pass\nengine CPU ms a turn: median {result['median']:.3f} (passes: {passes})"
    )
