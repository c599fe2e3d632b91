"""Where a warm turn's CPU goes: pyinstrument over warm turns of one 100k-token session, in-process.

The hot path is bench/engine.py's `handle` (parse, prepare, serialise, record usage), the
proxy's whole per-request work besides moving bytes. Reports the heaviest functions by own
time and writes the full call tree as text (and HTML) to bench/results/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from bench.convo import Conversation
from bench.engine import handle, service
from bench.stats import table

RESULTS = Path(__file__).resolve().parent / "results"


def run_profile(tokens: int = 100_000, turns: int = 60, write: bool = True) -> dict[str, Any]:
    from pyinstrument import Profiler

    svc = service()
    conv = Conversation(f"profile-{tokens}")
    conv.grow_to(tokens)
    model = "gpt-4.1"
    bodies = []
    for _ in range(turns):
        conv.next_unit()
        bodies.append(orjson.dumps({"model": model, "messages": conv.messages, "tools": conv.tools}))
    handle(svc, orjson.dumps({"model": model, "messages": conv.messages[: -2 * turns], "tools": conv.tools}), "p")
    profiler = Profiler(interval=0.0002)
    profiler.start()
    for raw in bodies:
        handle(svc, raw, "p")
    profiler.stop()
    session = profiler.last_session
    assert session is not None
    own: dict[str, float] = {}
    inclusive: dict[str, float] = {}

    def walk(frame: Any) -> None:
        """Own time per function: its time less its real children's (pyinstrument's `[self]` rows fold in)."""
        if frame is None:
            return
        real = [c for c in frame.children if not c.function.startswith("[")]
        key = f"{frame.function} ({Path(frame.file_path or '?').name}:{frame.line_no})"
        own[key] = own.get(key, 0.0) + frame.time - sum(c.time for c in real)
        inclusive[key] = inclusive.get(key, 0.0) + frame.time
        for child in real:
            walk(child)

    root = session.root_frame()
    walk(root)
    total = root.time if root else 0.0
    top = sorted(own.items(), key=lambda kv: kv[1], reverse=True)[:15]
    out: dict[str, Any] = {
        "tokens": tokens,
        "turns": turns,
        "ms_per_turn": total * 1e3 / turns,
        "top_self": [{"function": k, "share": v / total if total else 0.0} for k, v in top],
        "top_inclusive": [
            {"function": k, "share": v / total if total else 0.0}
            for k, v in sorted(inclusive.items(), key=lambda kv: kv[1], reverse=True)
            if not k.startswith(("run_profile", "handle", "_Inputs.run", "run "))
        ][:15],
    }
    if write:
        RESULTS.mkdir(exist_ok=True)
        text = profiler.output_text(unicode=False, color=False, show_all=False)
        (RESULTS / "profile_warm_turn.txt").write_text(text)
        out["tree"] = str(RESULTS / "profile_warm_turn.txt")
    return out


def render(result: dict[str, Any]) -> str:
    rows = [[r["function"], f"{r['share']:.1%}"] for r in result["top_self"]]
    lines = [
        f"warm turns of a {result['tokens']:,}-token session: {result['turns']} turns, "
        f"{result['ms_per_turn']:.2f} ms wall per turn under the profiler",
        table(["function (own time)", "share"], rows),
        "",
        table(
            ["function (with callees)", "share"],
            [[r["function"], f"{r['share']:.1%}"] for r in result["top_inclusive"]],
        ),
    ]
    if "tree" in result:
        lines.append(f"\ncall tree: {result['tree']}")
    return "\n".join(lines)
