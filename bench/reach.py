"""Reach-back trust learned from an agent's finished sessions (issue 27), measured in-process on every set.

A fleet of each agent, as `bench fleet` serves one, but in-process and scored as `bench quality` scores: each run
of the history is replayed through the engine (default policy, no history) and its session's own count of how
far back the agent reached (`RecallIndex.evidence` / `older`, `proxy.context.reach`) joins its agent's history,
as the service's sweep does at a session's end; each measured run is then replayed with its agent's
`Lifetimes(reach=...)` handed to the engine, as the service hands it. History: for a tuned set (packaged,
sample A, others A) every tuned run but the one measured; for a held-out set (held-out, sample B, others B)
every tuned run (the same agent kinds; never a held-out run).

Which runs are one agent's: `fingerprint`, the proxy's own key (the tools' schemas and the system prompt's first
2,000 characters: most public SWE-agent runs name their task there, so each is an agent of its own), or `kind`,
what the run's agent is (its format, whether it calls tools, the system prompt's first 60 characters: mini-swe-agent,
SWE-agent function calling, text mode, CTF, OpenHands), what the proxy would see of a fleet of one such agent.

`python -m bench reach [--set NAME ...]`: per set, 128k and 32k, d = 1 and 0.5: billed ÷ direct, lost, turns
losing 3+, turns over the window; the default without history, then with each key's history.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from bench.quality import Score, Setting, measure, named_sets
from bench.stats import table
from proxy.context.reach import Reach
from proxy.context.survival import Lifetimes
from proxy.context.tokens import Counter
from proxy.demo.traces import Trace, load_trace
from proxy.state.sessions import AGENT_SYSTEM_CHARS
from tests.context.replay import model, policy_for, run

TUNED = ("packaged", "sample A", "others A")
WINDOWS = (128000, 32000)
DISCOUNTS = (1.0, 0.5)
KEYS = ("none", "fingerprint", "kind")
DEFAULT = Setting("proxy default")


def agent_key(trace: Trace, key: str) -> str:
    """Which agent `trace` is a run of, by `key` (see the module's docstring)."""
    system = next((m for m in trace.messages if m.get("role") in ("system", "developer")), None)
    text = str(system.get("content") or "") if system else ""
    if key == "kind":
        return f"{trace.format}|{bool(trace.tools)}|{text[:60]}"
    hasher = hashlib.sha256(orjson.dumps(trace.tools or [], option=orjson.OPT_SORT_KEYS, default=repr))
    hasher.update(text[:AGENT_SYSTEM_CHARS].encode("utf-8", "surrogatepass"))
    return hasher.hexdigest()[:24]


def session_reach(trace: Trace, counter: Counter) -> tuple[int, int]:
    """The engine's own count over one session: evidence tokens, and those only older outputs held."""
    r = run(trace, policy_for(trace), model(128000, 1.0), counter)
    recall = r.outcomes[-1].journal.recall
    return recall.evidence, recall.older


def history(runs: list[tuple[str, str, tuple[int, int]]], leave_out: str = "") -> dict[str, Reach]:
    """Per agent, the `Reach` of its finished runs (each `(name, agent, (evidence, older))`), but `leave_out`."""
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for name, agent, (evidence, older) in runs:
        if name != leave_out:
            s = sums[agent]
            s[0], s[1], s[2] = s[0] + 1, s[1] + evidence, s[2] + older
    return {agent: Reach(sessions=s[0], evidence=s[1], older=s[2]) for agent, s in sums.items()}


def run_reach(sets: dict[str, list[str | Path]] | None = None) -> dict[str, Any]:
    """Per measured set and key: the history pass (tuned runs in order, each with the runs before it as history),
    the tuned sets again (every other tuned run as history), the held-out sets (the tuned runs and the held-out
    runs served before it)."""
    from proxy.tokens.counter import counter_for

    counter = counter_for("o200k_base")
    every = named_sets()
    measured = sets or every
    traces = {str(n): load_trace(n) for names in every.values() for n in names}
    counts = {name: session_reach(trace, counter) for name, trace in traces.items()}
    tuned = [str(n) for s in TUNED for n in every[s]]
    passes: list[tuple[str, str, list[str]]] = [("history pass", s, [str(n) for n in every[s]]) for s in TUNED]
    passes += [("again" if s in TUNED else "held out", s, [str(n) for n in every[s]]) for s in measured]
    rows = []
    for key in KEYS:
        agent = {n: ("" if key == "none" else agent_key(t, key)) for n, t in traces.items()}
        served: list[str] = []  # the history pass's runs so far, then the held-out runs so far
        held: list[str] = list(tuned)
        for kind, set_name, names in passes:
            if kind != "history pass" and set_name not in measured:
                continue
            row: dict[str, Any] = {"pass": kind, "set": set_name, "history": key, "trusted_runs": 0}
            known: dict[str, Reach] = {}
            for name in names:
                if key == "none":
                    known[name] = Reach()
                    continue
                if kind == "history pass":
                    before = served
                elif kind == "again":
                    before = [n for n in tuned if n != name]
                else:
                    before = held
                known[name] = history([(n, agent[n], counts[n]) for n in before]).get(agent[name], Reach())
                row["trusted_runs"] += known[name].trusts_newest()
                if kind == "history pass":
                    served.append(name)
                elif kind == "held out":
                    held.append(name)
            for window in WINDOWS:
                for d in DISCOUNTS:
                    total, billed, direct = Score(), 0.0, 0.0
                    for name in names:
                        m = measure(DEFAULT, traces[name], window, d, counter, Lifetimes(reach=known[name]))
                        total.add(m["score"])
                        billed, direct = billed + m["billed"], direct + m["direct"]
                    row[f"{window}/{d}"] = {
                        "billed_ratio": billed / direct,
                        "lost_rate": total.rate,
                        "turns_lost3": total.share("lost3"),
                        "failed": total.failed,
                    }
            rows.append(row)
    shares = {}
    for key in KEYS[1:]:
        for agent_id, reach in history([(n, agent_key(traces[n], key), counts[n]) for n in tuned]).items():
            shares[f"{key}:{agent_id[:40]}"] = {
                "sessions": reach.sessions,
                "evidence": reach.evidence,
                "share": reach.share,
            }
    return {"rows": rows, "agents": shares}


def render(result: dict[str, Any]) -> str:
    header = ["pass", "set", "history", "trusted runs"]
    header += [f"{w // 1000}k d={d}: {c}" for w in WINDOWS for d in DISCOUNTS for c in ("billed", "lost")]
    header += ["128k >=3 lost", "32k >=3 lost", "32k failed"]
    body = []
    for r in result["rows"]:
        cells = [r["pass"], r["set"], r["history"], r["trusted_runs"]]
        for w in WINDOWS:
            for d in DISCOUNTS:
                p = r[f"{w}/{d}"]
                cells += [f"{p['billed_ratio']:.3f}", f"{p['lost_rate']:.3f}"]
        cells += [f"{r[f'{WINDOWS[0]}/1.0']['turns_lost3']:.3f}", f"{r[f'{WINDOWS[-1]}/1.0']['turns_lost3']:.3f}"]
        cells.append(r[f"{WINDOWS[-1]}/1.0"]["failed"])
        body.append(cells)
    agents = [
        [name, a["sessions"], a["evidence"], "-" if a["share"] is None else f"{a['share']:.3f}"]
        for name, a in result["agents"].items()
    ]
    return "\n".join(
        [
            "in-process, default policy; history pass: tuned runs in order; again: every other tuned run; "
            "held out: tuned runs and the held-out runs before",
            table(header, body),
            "\nagents in the tuned history (reach-back share of evidence)",
            table(["agent", "sessions", "evidence", "share"], agents),
        ]
    )
