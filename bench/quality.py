"""What the edits cost the agent: the specific tokens its next message used that the request no longer held.

For each turn of a trace: D = what the client sent (`messages[:i]`), C = what was sent upstream,
A = the agent's recorded next message (text and tool-call arguments). Evidence = A's specific
tokens (`proxy.context.recall`) found in D's tool outputs and not in what is never edited (system
messages, the task, the tools schema). Lost = evidence found nowhere in C; "old" evidence is the
part only outputs older than the newest one held. Each policy is replayed in-process through
`tests.context.replay.run` (the proxy's `process`, or a peer's rule in its place) and billed with
the same prefix-cache model, so cost and loss come from the same requests.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.stats import table
from proxy.context.clearing import PLACEHOLDER
from proxy.context.messages import content_text, is_tool_output
from proxy.context.patterns import compile_patterns
from proxy.context.recall import message_tokens, specific_tokens
from proxy.context.survival import NO_HISTORY, Lifetimes
from proxy.context.tokens import Counter
from proxy.demo.traces import Trace, load_trace
from tests.context.replay import TRACE_NAMES, model, policy_for, run

RESULTS = Path(__file__).resolve().parent / "results"
HELD_OUT = Path(__file__).resolve().parent / "traces"
WINDOWS = (128000, 32000)
DISCOUNTS = (1.0, 0.5, 0.1)
Send = Callable[[list[dict]], list[dict]]


@dataclass
class Score:
    """One policy over some turns: evidence and lost tokens, and how many turns lost at least 1 and 3."""

    turns: int = 0
    evidence: int = 0
    lost: int = 0
    lost1: int = 0
    lost3: int = 0
    old_evidence: int = 0
    old_lost: int = 0
    old_lost1: int = 0
    old_lost3: int = 0
    # What the next message used that stood, in the client's request, only in the agent's own messages (not in an
    # output, the task or the instructions), and how much of it was not sent; turns losing 3+ of both kinds.
    own_evidence: int = 0
    own_lost: int = 0
    all_lost3: int = 0
    failed: int = 0  # turns over the window (the upstream would refuse them)
    task_dropped: int = 0
    last_altered: int = 0

    def add(self, other: Score) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def rate(self) -> float:
        return self.lost / self.evidence if self.evidence else 0.0

    @property
    def own_rate(self) -> float:
        return self.own_lost / self.own_evidence if self.own_evidence else 0.0

    @property
    def all_rate(self) -> float:
        """Lost of what the next message used from outputs and from the agent's own messages together."""
        used = self.evidence + self.own_evidence
        return (self.lost + self.own_lost) / used if used else 0.0

    @property
    def old_rate(self) -> float:
        return self.old_lost / self.old_evidence if self.old_evidence else 0.0

    def share(self, name: str) -> float:
        return getattr(self, name) / self.turns if self.turns else 0.0


class _Tokens:
    """Specific tokens per message, computed once per message object (a trace's messages are shared by its turns)."""

    def __init__(self) -> None:
        self.memo: dict[int, tuple[dict, frozenset[str]]] = {}

    def __call__(self, message: dict) -> frozenset[str]:
        hit = self.memo.get(id(message))
        if hit is None or hit[0] is not message:
            hit = self.memo[id(message)] = (message, message_tokens(message))
        return hit[1]


def _never_edited(trace: Trace, tokens: _Tokens) -> frozenset[str]:
    """Tokens of what no policy edits: system messages, the task (first user message), the tools schema."""
    messages = trace.messages
    fixed = [m for m in messages if m.get("role") in ("system", "developer")]
    fixed += [m for m in messages if m.get("role") == "user"][:1]
    schema = specific_tokens(json.dumps(trace.tools or []))
    return frozenset().union(schema, *(tokens(m) for m in fixed))


def score(trace: Trace, sent: list[list[dict]], usable: int, counts: list[int] | None = None) -> Score:
    """Score the requests `sent` for each turn of `trace` (in `turns` order); `counts` their sizes, for failures."""
    tokens = _Tokens()
    patterns = compile_patterns(policy_for(trace).clear_tool_outputs.observation_patterns)
    fixed = _never_edited(trace, tokens)
    messages = trace.messages
    task = next((m for m in messages if m.get("role") == "user"), None)
    out = Score()
    k = 0
    for i, answer in enumerate(messages):
        if answer.get("role") != "assistant":
            continue
        request, upstream = messages[:i], sent[k]
        out.add(_turn(request, upstream, answer, fixed, patterns, tokens))
        out.failed += counts is not None and counts[k] > usable
        out.task_dropped += task is not None and task in request and not any(m is task or m == task for m in upstream)
        out.last_altered += bool(request) and (not upstream or upstream[-1] != request[-1])
        k += 1
    return out


def _turn(request: list[dict], upstream: list[dict], answer: dict, fixed, patterns, tokens: _Tokens) -> Score:
    used = tokens(answer) - fixed
    if not used:
        return Score(turns=1)
    present = frozenset().union(*(tokens(m) for m in upstream))
    own, own_lost = _own(request, used, present, tokens)
    outputs = [m for m in request if is_tool_output(m, patterns)]
    evidence = used & frozenset().union(*(tokens(m) for m in outputs)) if outputs else frozenset()
    if not evidence:
        return Score(turns=1, own_evidence=own, own_lost=own_lost, all_lost3=own_lost >= 3)
    elsewhere = frozenset().union(tokens(outputs[-1]), *(tokens(m) for m in request if not is_tool_output(m, patterns)))
    old = evidence - elsewhere
    lost, old_lost = len(evidence - present), len(old - present)
    return Score(
        1, len(evidence), lost, lost >= 1, lost >= 3, len(old), old_lost, old_lost >= 1, old_lost >= 3,
        own, own_lost, lost + own_lost >= 3,
    )  # fmt: skip


def _own(request: list[dict], used: frozenset[str], present: frozenset[str], tokens: _Tokens) -> tuple[int, int]:
    """Of the tokens `used`, how many stood in `request` only in the agent's own messages, and how many of those
    are not `present` in what was sent."""
    agent = frozenset().union(*(tokens(m) for m in request if m.get("role") == "assistant"))
    if not used & agent:
        return 0, 0
    own = (used & agent) - frozenset().union(*(tokens(m) for m in request if m.get("role") != "assistant"))
    return len(own), len(own - present)


# Peers, replayed the same way ---------------------------------------------------------------------------------


def last_n_observations(n: int, patterns: tuple = ()) -> Send:
    """SWE-agent's `LastNObservations(n)` (polling 1): every observation but the last n says how many lines it had."""

    def send(request: list[dict]) -> list[dict]:
        observations = [i for i, m in enumerate(request) if is_tool_output(m, patterns)]
        omit = set(observations[: max(0, len(observations) - n)])
        return [
            {**m, "content": f"Old environment output: ({len((content_text(m) or '').splitlines())} lines omitted)"}
            if i in omit
            else m
            for i, m in enumerate(request)
        ]

    return send


def trim_messages(max_tokens: int, counter: Counter) -> Send:
    """LangChain's `trim_messages(strategy="last", include_system=True, allow_partial=False)`: the system
    message and the longest tail within `max_tokens`, starting on a user or assistant message."""

    def send(request: list[dict]) -> list[dict]:
        system = [m for m in request[:1] if m.get("role") == "system"]
        budget = max_tokens - sum(counter.count_message(m) for m in system)
        start = len(request)
        for i in range(len(request) - 1, len(system) - 1, -1):
            budget -= counter.count_message(request[i])
            if budget < 0:
                break
            start = i
        while start < len(request) - 1 and request[start].get("role") == "tool":
            start += 1
        return system + request[start:]

    return send


def clear_all_but_last(patterns: tuple = ()) -> Send:
    """Every tool output but the newest becomes the placeholder: the upper bound of what clearing can lose."""

    def send(request: list[dict]) -> list[dict]:
        outputs = [i for i, m in enumerate(request) if is_tool_output(m, patterns)][:-1]
        return [{**m, "content": PLACEHOLDER} if i in set(outputs) else m for i, m in enumerate(request)]

    return send


# Policies ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One row of the frontier: a name and how it is built for a trace and window."""

    name: str
    clear: dict[str, Any] = field(default_factory=dict)  # overrides of the default ClearPolicy
    policy: dict[str, Any] = field(default_factory=dict)  # overrides of the default Policy
    peer: str = ""  # "" = the proxy; else a peer's rule


SETTINGS = (
    Setting("proxy default"),
    Setting("proxy stubs (stub_tokens=600)", clear={"stub_tokens": 600}),
    Setting("proxy stubs, in-use off", clear={"stub_tokens": 600, "in_use_turns": 0}),
    Setting("proxy forced stubs off (forced_stub_tokens=0)", clear={"forced_stub_tokens": 0}),
    Setting("proxy agent messages whole (agent_message_tokens=0)", policy={"agent_message_tokens": 0}),
    Setting("proxy miss adaptation off", clear={"miss_keep_tokens": 0}),
    Setting("proxy first_edit_risk_turns=1", policy={"first_edit_risk_turns": 1.0}),
    Setting("proxy before in-use (keep_tokens=2000)", clear={"in_use_turns": 0, "keep_tokens": 2000}),
    Setting("proxy in-use off", clear={"in_use_turns": 0}),
    Setting("proxy keep_tokens=8000", clear={"keep_tokens": 8000}),
    Setting("proxy keep_tokens=20000", clear={"keep_tokens": 20000}),
    Setting("proxy clear_at_least=4000", clear={"clear_at_least": 4000}),
    Setting("proxy soft_budget=8000", policy={"soft_budget_tokens": 8000}),
    Setting("clearing off", clear={"enabled": False}),
    Setting("LastNObservations(5)", peer="last5"),
    Setting("trim_messages(max_tokens=1/4 window)", peer="trim"),
    Setting("clear all but last", peer="all_but_last"),
    Setting("direct", peer="direct"),
)


def _send(setting: Setting, trace: Trace, window: int, counter: Counter) -> Send | None:
    patterns = compile_patterns(policy_for(trace).clear_tool_outputs.observation_patterns)
    return {
        "": None,
        "direct": lambda request: request,
        "last5": last_n_observations(5, patterns),
        "trim": trim_messages(window // 4, counter),
        "all_but_last": clear_all_but_last(patterns),
    }[setting.peer]


def measure(
    setting: Setting, trace: Trace, window: int, d: float, counter: Counter, lifetimes: Lifetimes = NO_HISTORY
) -> dict[str, Any]:
    """One setting on one trace at one window and discount (`lifetimes`: its agent's history): score and bills."""
    base = policy_for(trace)
    policy = replace(base, **setting.policy, clear_tool_outputs=replace(base.clear_tool_outputs, **setting.clear))
    info = model(window, d)
    r = run(trace, policy, info, counter, send=_send(setting, trace, window, counter), lifetimes=lifetimes)
    counts = [sum(counter.count_message(m) for m in request) for request in r.requests]
    usable = window - policy.reserve_output_tokens
    return {"score": score(trace, r.requests, usable, counts), "billed": r.proxied.billed, "direct": r.direct.billed}


def held_out(sample: str = "") -> list[Path]:
    """The held-out traces (`bench/traces/*.json`), or those of one sample (`sample_a`, `sample_b`, `sample_c`)."""
    return sorted((HELD_OUT / sample).glob("*.json"))


def named_sets(names: list[str] | None = None) -> dict[str, list[str | Path]]:
    """The sets of traces `bench quality` reports, or those of them named. "others A" and "others B" are runs of
    other agents (SWE-agent, OpenHands: `bench/traces/others.py`), A tuned on, B held out."""
    sets: dict[str, list[str | Path]] = {
        "packaged": list(TRACE_NAMES),
        "held-out": list(held_out()),
        "sample A": list(held_out("sample_a")),
        "sample B": list(held_out("sample_b")),
        "sample C": list(held_out("sample_c")),
        "others A": list(held_out("others_a")),
        "others B": list(held_out("others_b")),
    }
    unknown = sorted(set(names or ()) - set(sets))
    if unknown:
        raise SystemExit(f"no set {', '.join(map(repr, unknown))}; sets: {', '.join(sets)}")
    return {name: sets[name] for name in names} if names else sets


def run_quality(
    sets: dict[str, list[str | Path]] | None = None, plot: bool = True, only: list[str] | None = None
) -> dict[str, Any]:
    from proxy.tokens.counter import counter_for

    counter = counter_for("o200k_base")
    sets = sets or named_sets()
    settings = [s for s in SETTINGS if not only or s.name in only]
    rows = []
    for set_name, names in sets.items():
        traces = [load_trace(n) for n in names]
        if not traces:
            continue
        for setting in settings:
            for window in WINDOWS:
                rows.append(policy_row(set_name, setting, window, traces, counter))
    result: dict[str, Any] = {"rows": rows}
    if plot and importlib.util.find_spec("matplotlib") is not None:  # the plot is optional, the table is not
        result["plot"] = str(_plot(rows))
    return result


def policy_row(set_name: str, setting: Setting, window: int, traces: list[Trace], counter: Counter) -> dict[str, Any]:
    row: dict[str, Any] = {"set": set_name, "setting": setting.name, "window": window}
    for d in DISCOUNTS:
        total, billed, direct, worst = Score(), 0.0, 0.0, 0.0
        for trace in traces:
            m = measure(setting, trace, window, d, counter)
            total.add(m["score"])
            billed, direct = billed + m["billed"], direct + m["direct"]
            worst = max(worst, m["billed"] / m["direct"])
        row[str(d)] = {
            "turns": total.turns,
            "evidence": total.evidence,
            "lost": total.lost,
            "lost_rate": total.rate,
            "turns_lost1": total.share("lost1"),
            "turns_lost3": total.share("lost3"),
            "own_evidence": total.own_evidence,
            "own_lost_rate": total.own_rate,
            "all_lost_rate": total.all_rate,
            "turns_all_lost3": total.share("all_lost3"),
            "old_evidence": total.old_evidence,
            "old_lost_rate": total.old_rate,
            "old_turns_lost1": total.share("old_lost1"),
            "old_turns_lost3": total.share("old_lost3"),
            "failed": total.failed,
            "task_dropped": total.task_dropped,
            "last_altered": total.last_altered,
            "billed_ratio": billed / direct,
            "worst_trace_ratio": worst,
        }
    return row


def _plot(rows: list[dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = sorted({r["set"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(len(sets) * len(WINDOWS), len(DISCOUNTS), figsize=(15, 4.2 * len(sets) * len(WINDOWS)))
    for a, (set_name, window) in enumerate((s, w) for s in sets for w in WINDOWS):
        for b, d in enumerate(DISCOUNTS):
            ax = axes[a][b]
            for r in rows:
                if r["set"] != set_name or r["window"] != window:
                    continue
                p = r[str(d)]
                marker = "s" if r["setting"].startswith("proxy") else "o"
                ax.scatter(p["lost_rate"], p["billed_ratio"], marker=marker)
                ax.annotate(r["setting"], (p["lost_rate"], p["billed_ratio"]), fontsize=6)
            ax.set_title(f"{set_name}, {window // 1000}k window, d = {d}", fontsize=9)
            ax.set_xlabel("lost rate (evidence the next message used, not sent)", fontsize=8)
            ax.set_ylabel("billed input / direct", fontsize=8)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "quality_frontier.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def render(result: dict[str, Any]) -> str:
    header = [
        "set", "window", "setting", "d", "turns", "evidence", "lost rate", ">=1 lost", ">=3 lost", "old rate",
        "old >=1", "old >=3", "own lost", "all lost", "all >=3", "failed", "billed/direct", "worst trace",
    ]  # fmt: skip
    rows = []
    for r in result["rows"]:
        for d in DISCOUNTS:
            p = r[str(d)]
            rows.append(
                [
                    r["set"], f"{r['window'] // 1000}k", r["setting"], d, p["turns"], p["evidence"],
                    f"{p['lost_rate']:.3f}", f"{p['turns_lost1']:.3f}", f"{p['turns_lost3']:.3f}",
                    f"{p['old_lost_rate']:.3f}", f"{p['old_turns_lost1']:.3f}", f"{p['old_turns_lost3']:.3f}",
                    f"{p['own_lost_rate']:.3f}", f"{p['all_lost_rate']:.3f}", f"{p['turns_all_lost3']:.3f}",
                    p["failed"], f"{p['billed_ratio']:.3f}", f"{p['worst_trace_ratio']:.3f}",
                ]
            )  # fmt: skip
    lines = [table(header, rows)]
    if "plot" in result:
        lines.append(f"\nplot: {result['plot']}")
    return "\n".join(lines)
