"""What compaction saves and loses (`proxy/context/steps/compact.py`), per trace set, and what each transform could.

Two parts. The transforms: every tool output of every trace compacted against all earlier outputs
(the most any rule could point at), as a share of the output tokens each removes: runs of lines
standing in an earlier output, runs standing higher up in the same output, lines repeated back to back;
and, on what all three leave, the most two log folds could still remove (not built; measured for issue 27):
lines equal to one higher up once numbers are masked (a log's repeated template) and the part of a line it
shares with the line before (a listing's common path), each counted whole, as if folding kept nothing of it.
The policy: each set replayed through `process` with `compact` on and off and `mode = "lossless"`
(`bench.quality.measure`: the same bills and lost measure as `bench quality`), at 128k and 32k,
d = 1 / 0.5 / 0.1. And what bounds it at d = 0.1: every output compacted against every earlier one,
whatever it costs, billed with the same cache model, with the newest output as the client sent it (the
proxy's rule) and compacted on arrival too (a peer's that edits what the agent is shown).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bench.quality import Send, Setting, held_out, policy_row
from bench.stats import table
from proxy.context.compact import OWN, REPEATED, Places, apply, sources_of
from proxy.context.messages import content_text, is_tool_output
from proxy.context.patterns import compile_patterns
from proxy.context.tokens import Counter
from proxy.demo.traces import Trace, load_trace
from tests.context.replay import TRACE_NAMES, model, policy_for, run

DISCOUNTS = (1.0, 0.5, 0.1)
LABEL = "the output of call call_0123456789abcdef above"  # a pointer's label as long as a real call id's
WINDOWS = (128000, 32000)
NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")
SHARED_PREFIX = 16  # characters a line shares with the one before it before a fold could point at them
SETTINGS = (
    Setting("compact off", policy={"compact": False}),
    Setting("compact on (default)"),
    Setting("mode = lossless", policy={"mode": "lossless"}),
)


def sets() -> dict[str, list[str | Path]]:
    return {
        "packaged": list(TRACE_NAMES),
        "held-out": list(held_out()),
        "sample A": list(held_out("sample_a")),
        "sample B": list(held_out("sample_b")),
        "others A": list(held_out("others_a")),
        "others B": list(held_out("others_b")),
    }


def transforms(traces: list[Trace], counter: Counter) -> dict[str, float]:
    """The share of all output tokens each transform removes, every output compacted against all before it."""
    total = runs_saved = own_saved = repeats_saved = templates = prefixes = 0
    for trace in traces:
        patterns = compile_patterns(policy_for(trace).clear_tool_outputs.observation_patterns)
        places = Places()
        for i, message in enumerate(trace.messages):
            text = content_text(message)
            if text is None or not is_tool_output(message, patterns):
                continue
            runs = places.runs(text)
            size = counter.count_text(text)
            total += size
            labels = {run.source: "the output of call c0 above" for run in runs}
            runs_saved += size - counter.count_text(apply(text, [r for r in runs if r.source >= 0], labels))
            own_saved += size - counter.count_text(apply(text, [r for r in runs if r.source == OWN], labels))
            repeats_saved += size - counter.count_text(apply(text, [r for r in runs if r.source == REPEATED], labels))
            template, prefix = _folds(apply(text, runs, labels), counter)
            templates, prefixes = templates + template, prefixes + prefix
            places.add(i, text)
    share = 1 / max(1, total)
    return {
        "output_tokens": total,
        "runs": runs_saved * share,
        "own": own_saved * share,
        "repeats": repeats_saved * share,
        "templates": templates * share,
        "prefixes": prefixes * share,
    }


def _folds(text: str, counter: Counter) -> tuple[int, int]:
    """Tokens of `text`'s lines equal to one higher up with numbers masked, and of the prefixes (from
    `SHARED_PREFIX` characters) its lines share with the line before: what log folds could at most remove."""
    templates = prefixes = 0
    seen: set[str] = set()
    before = ""
    for line in text.split("\n"):
        masked = NUMBERS.sub("#", line.strip())
        if len(masked) >= 8 and masked in seen:
            templates += counter.count_text(line)
        else:
            shared = next((k for k, (a, b) in enumerate(zip(line, before, strict=False)) if a != b), None)
            shared = min(len(line), len(before)) if shared is None else shared
            if shared >= SHARED_PREFIX:
                prefixes += counter.count_text(line[:shared])
        seen.add(masked)
        before = line
    return templates, prefixes


def every_output_compacted(trace: Trace, newest_too: bool) -> Send:
    """Each tool output compacted against every earlier one (as the client sent them), sent so from the turn
    after it arrived, or from its own turn with `newest_too`: the most runs of lines can save, at any cost."""
    patterns = compile_patterns(policy_for(trace).clear_tool_outputs.observation_patterns)
    compacted: dict[int, dict] = {}
    places = Places()
    for i, message in enumerate(trace.messages):
        text = content_text(message)
        if text is None or not is_tool_output(message, patterns):
            continue
        if runs := places.runs(text):
            compacted[id(message)] = {**message, "content": apply(text, runs, dict.fromkeys(sources_of(runs), LABEL))}
        places.add(i, text)

    def send(request: list[dict]) -> list[dict]:
        last = len(request) - 1
        return [compacted.get(id(m), m) if k < last or newest_too else m for k, m in enumerate(request)]

    return send


def bound(traces: list[Trace], counter: Counter, newest_too: bool, d: float = 0.1) -> float:
    """Billed / direct at 128k of `every_output_compacted`."""
    billed = direct = 0.0
    for trace in traces:
        r = run(trace, policy_for(trace), model(128000, d), counter, send=every_output_compacted(trace, newest_too))
        billed, direct = billed + r.proxied.billed, direct + r.direct.billed
    return billed / direct


def run_compaction() -> dict[str, Any]:
    from proxy.tokens.counter import counter_for

    counter = counter_for("o200k_base")
    result: dict[str, Any] = {"transforms": {}, "rows": [], "bounds": {}}
    for name, paths in sets().items():
        traces = [load_trace(p) for p in paths]
        result["transforms"][name] = transforms(traces, counter)
        bounds = {"newest as sent": bound(traces, counter, False), "newest too": bound(traces, counter, True)}
        result["bounds"][name] = bounds
        for window in WINDOWS:
            for setting in SETTINGS:
                result["rows"].append(policy_row(name, setting, window, traces, counter))
    return result


def render(result: dict[str, Any]) -> str:
    lines = ["Transforms (share of all output tokens removed, each output against all earlier ones):"]
    lines.append(
        table(
            [
                "set",
                "output tokens",
                "runs standing in an earlier output",
                "higher up in the same",
                "lines repeated",
                "then, at most: a log's templates",
                "a listing's shared prefixes",
            ],
            [
                [
                    name,
                    t["output_tokens"],
                    *(f"{t[k]:.3f}" for k in ("runs", "own", "repeats", "templates", "prefixes")),
                ]
                for name, t in result["transforms"].items()
            ],
        )
    )
    lines.append("\nWhat bounds it at d = 0.1, 128k (every output compacted against all earlier ones, at any cost):")
    lines.append(
        table(
            ["set", "newest output as the client sent it", "newest compacted too"],
            [[name, f"{b['newest as sent']:.3f}", f"{b['newest too']:.3f}"] for name, b in result["bounds"].items()],
        )
    )
    lines.append("\nThe policy (billed / direct, worst trace, lost rate, turns over the window):")
    header = ["set", "window", "setting"] + [f"d={d}" for d in DISCOUNTS]
    rows = []
    for r in result["rows"]:
        cells = [
            f"{r[str(d)]['billed_ratio']:.3f} ({r[str(d)]['worst_trace_ratio']:.3f}) lost {r[str(d)]['lost_rate']:.3f}"
            + (f" failed {r[str(d)]['failed']}" if r[str(d)]["failed"] else "")
            for d in DISCOUNTS
        ]
        rows.append([r["set"], f"{r['window'] // 1000}k", r["setting"], *cells])
    lines.append(table(header, rows))
    return "\n".join(lines)
