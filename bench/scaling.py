"""Proxy CPU per request against conversation size: the first request of a session and warm turns.

In-process (bench/engine.py): parse + prepare + serialise + record usage, timed with
`time.process_time`. The reference run alongside is an orjson parse + serialise of the same
body, the least any body-rewriting proxy pays. `--api messages` sends the same conversations as Claude Code
would (`proxy.demo.traces_messages`), `--api responses` as Codex would (`proxy.demo.traces_responses`).
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from bench.convo import Conversation
from bench.engine import PHASES, handle, reference, service
from bench.stats import median, table
from proxy.demo.traces import Trace
from proxy.demo.traces_messages import messages_requests
from proxy.demo.traces_responses import responses_requests
from proxy.dialects import CHAT, MESSAGES, RESPONSES

SIZES = (10_000, 50_000, 100_000, 200_000)
# 1M windows: no size here forces truncation, so warm turns are steady-state.
MODELS = {"chat": "gpt-4.1", "messages": "claude-opus-4-7", "responses": "gpt-4.1"}
MODEL = MODELS["chat"]
DIALECTS = {"chat": CHAT, "messages": MESSAGES, "responses": RESPONSES}


def cpu_ms(fn: Callable[[], Any]) -> float:
    gc.collect()
    started = time.process_time()
    fn()
    return (time.process_time() - started) * 1e3


def _raw(conv: Conversation, api: str = "chat") -> bytes:
    """The request the conversation is now, as the API's client sends it."""
    if api == "chat":
        return orjson.dumps({"model": MODEL, "messages": conv.messages, "tools": conv.tools})
    trace = Trace("scaling", "bench.convo", conv.tools, [*conv.messages, {"role": "assistant", "content": "next"}])
    bodies = messages_requests(trace, MODELS[api]) if api == "messages" else responses_requests(trace, MODELS[api])
    return orjson.dumps(deque(bodies, maxlen=1)[0])  # the last: every message so far


def measure(size: int, warm_turns: int, firsts: int, api: str = "chat") -> dict[str, Any]:
    svc, dialect = service(), DIALECTS[api]
    first, warm, refs, epochs = [], [], [], 0
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    for k in range(firsts):
        conv = Conversation(f"scale{size}-{k}-{time.monotonic_ns()}")
        conv.grow_to(size)
        raw = _raw(conv, api)
        session = f"bench-scale-{size}-{k}"
        first.append(cpu_ms(lambda raw=raw, session=session: handle(svc, raw, session, dialect=dialect)))
        if k:
            continue
        for _ in range(warm_turns):
            conv.next_unit()
            raw = _raw(conv, api)
            refs.append(cpu_ms(lambda raw=raw: reference(raw)))
            gc.collect()
            turn, split = handle(svc, raw, session, dialect=dialect)
            warm.append(sum(split.values()))
            for phase, ms in split.items():
                phases[phase].append(ms)
            epochs += turn.headers.get("X-Context-Epoch") == "1"
    return {
        "tokens": size,
        "body_bytes": len(raw),
        "first_ms": median(first),
        "warm_ms": median(warm),
        "warm_max_ms": max(warm),
        "reference_ms": median(refs),
        "warm_vs_reference": median(warm) / median(refs) if median(refs) else None,
        "warm_epochs": epochs,
        "warm_phases_ms": {p: median(v) for p, v in phases.items()},
    }


def run_scaling(
    sizes: tuple[int, ...] = SIZES, warm_turns: int = 9, firsts: int = 3, api: str = "chat"
) -> dict[str, Any]:
    rows = [measure(size, warm_turns, firsts, api) for size in sizes]
    smallest, largest = rows[0], rows[-1]
    at_100k = next((r for r in rows if r["tokens"] == 100_000), None)
    return {
        "api": api,
        "model": MODELS[api],
        "rows": rows,
        "largest_vs_smallest_warm": largest["warm_ms"] / smallest["warm_ms"],
        "meets_proportional": largest["warm_ms"] <= 2 * smallest["warm_ms"],
        "meets_100k_under_5ms": at_100k["warm_ms"] < 5 if at_100k else None,
    }


def render(result: dict[str, Any]) -> str:
    rows = [
        [r["tokens"], r["body_bytes"], r["first_ms"], r["warm_ms"], r["warm_max_ms"], r["reference_ms"],
         r["warm_vs_reference"], r["warm_epochs"], *r["warm_phases_ms"].values()]
        for r in result["rows"]
    ]  # fmt: skip
    header = [
        "tokens",
        "body bytes",
        "first ms",
        "warm ms (median)",
        "warm max",
        "orjson ref ms",
        "warm/ref",
        "epochs",
        *(f"warm {p} ms" for p in PHASES),
    ]
    return "\n".join(
        [
            f"{result.get('api', 'chat')}, model {result['model']}; CPU ms per request (process_time): "
            "parse + prepare + serialise + usage",
            table(header, rows),
            f"largest/smallest warm: {result['largest_vs_smallest_warm']:.2f} (target <= 2); "
            f"100k warm under 5 ms: {result['meets_100k_under_5ms']}",
        ]
    )
