"""The frontier of lost vs billed per set, and the clairvoyant clearing that bounds it (issue 27).

`bench quality` measures what a rule costs the agent (lost: the specific tokens its next message used from tool
outputs that the request upstream no longer held) and what it bills (uncached + d × cached, ÷ direct). This bench
puts the proxy's rules on that plane next to an oracle that knows the agent's future messages:

- **Needs.** For each turn u, the evidence its recorded answer uses (`bench.quality.score`'s: the answer's
  specific tokens found in the request's tool outputs, less the system, the task and the tools schema); a token
  a message that is never cleared (an assistant or user message) also holds is safe. Each other token needs one
  output that holds it sent whole on turn u.
- **Deaths.** Each output is sent whole from the request it arrives in (the agent sees every output once) to
  the last turn whose needed tokens it holds, then cleared to the placeholder. Then, greedily, an output's end
  is pulled back to its previous use wherever another output still sent holds those tokens (lost 0); with a
  budget, also where it loses some, the most token-turns freed per evidence token lost first, over the whole
  set, until the lost tokens reach `budget` × the set's evidence (the issue's 0.04).
- **Schedule.** At d = 1 an epoch re-bills nothing, so every output is cleared the turn it dies. At d < 1 each
  epoch re-bills the tail after the first output it clears at the full price: the epochs (each clearing every
  output dead by then) are chosen in hindsight by dynamic programming over the turn of the last one, on the
  client's messages with the dead outputs as placeholders (`hindsight.best_schedule`'s model).
- **Replay.** The oracle then stands in for the clearing planner inside the proxy's own engine
  (`proxy.context.pipeline`'s `Clearing`, swapped for the replay only), so dedup, compaction and the window's
  edits run as they do for every rule, and its requests are billed and scored with `bench.quality.measure`.

Within rules that clear whole outputs to the placeholder on top of the proxy's other edits, the oracle at lost 0
and d = 1 is the least any rule bills for the holders it picks (the newest output holding a token first); the
greedy budget and the d < 1 schedule are searches, not proofs, so their figures are what knowing the future buys
at least. A rule that keeps only some lines of an output (stubs) is outside that class. Where even the oracle
within the lost budget bills over a target, no clearing rule of this kind reaches it on that set; where it
reaches it, the gap to the proxy's rule is the cost of not knowing the future.

`python -m bench frontier [--set NAME ...]`: 128k, d = 1 and 0.5, the default, the knob variants tried and the
oracle (lost 0 and within 0.04), per set; in-process, deterministic, about a minute for every set.
"""

from __future__ import annotations

import functools
import heapq
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.hindsight import cheapest_epochs
from bench.quality import RESULTS, Score, Setting, _never_edited, _Tokens, measure, named_sets, score
from bench.stats import table
from proxy.context import pipeline
from proxy.context.clearing import PLACEHOLDER, ClearPlan
from proxy.context.draft import Draft
from proxy.context.journal import CLEARED, DROPPED
from proxy.context.messages import Message, is_tool_output, message_ids
from proxy.context.patterns import compile_patterns
from proxy.context.steps.clear import Clearing
from proxy.context.tokens import Counter
from proxy.demo.traces import Trace, load_trace, requests
from tests.context.replay import model, policy_for, run

WINDOW = 128000
DISCOUNTS = (1.0, 0.5)
BUDGET = 0.04  # issue 27: lost <= 0.04 at 128k
# The knob variants measured so far (BENCHMARKS.md, "Quality", "Other agents' runs", "Lossless mode"), and peers.
SETTINGS = (
    Setting("proxy default"),
    Setting("keep_under=50", clear={"keep_under": 50}),
    Setting("clear_at_least=500, keep_under=50", clear={"clear_at_least": 500, "keep_under": 50}),
    Setting("clear_at_least=4000", clear={"clear_at_least": 4000}),
    Setting("keep_tokens=500", clear={"keep_tokens": 500}),
    Setting("keep_tokens=8000", clear={"keep_tokens": 8000}),
    Setting("in-use off", clear={"in_use_turns": 0}),
    Setting("in_use_turns=4", clear={"in_use_turns": 4}),
    Setting("stubs (stub_tokens=600)", clear={"stub_tokens": 600}),
    Setting("clearing off", clear={"enabled": False}),
    Setting("clear all but last", peer="all_but_last"),
)


@dataclass
class Needs:
    """One trace's outputs and what each turn's answer needs of them."""

    trace: Trace
    outputs: list[int]  # client indices of the tool outputs
    arrival: dict[int, int]  # output -> the turn of the first request holding it
    freed: dict[int, int]  # output -> tokens the placeholder frees
    held: dict[int, dict[int, list[str]]] = field(default_factory=dict)  # output -> turn -> needed tokens it holds
    need: list[dict[str, list[int]]] = field(default_factory=list)  # turn -> needed token -> outputs holding it
    evidence: int = 0  # as `bench.quality.score` counts it (safe tokens included)
    death: dict[int, int] = field(default_factory=dict)  # output -> the first turn it is sent cleared

    @property
    def turns(self) -> int:
        return len(self.need)

    def alive(self, o: int, u: int) -> bool:
        return self.arrival[o] <= u < self.death[o]

    def stops(self, o: int) -> list[int]:
        """Where the output's end may move: the turn after its arrival, the turn after each turn it holds need of."""
        return sorted({self.arrival[o] + 1, *(u + 1 for u in self.held.get(o, {}))})

    def lost_if(self, o: int, end: int) -> int:
        """Needed tokens lost were `o` cleared from turn `end` on instead of `death[o]`: those no other output
        sent on that turn holds."""
        lost = 0
        for u in range(end, self.death[o]):
            for x in self.held.get(o, {}).get(u, ()):
                if not any(p != o and self.alive(p, u) for p in self.need[u][x]):
                    lost += 1
        return lost


def needs(trace: Trace, counter: Counter) -> Needs:
    """The outputs of `trace`, when each arrives, what it frees, and which of them hold each turn's needed tokens."""
    tokens = _Tokens()
    patterns = compile_patterns(policy_for(trace).clear_tool_outputs.observation_patterns)
    fixed = _never_edited(trace, tokens)
    messages = trace.messages
    outputs = [i for i, m in enumerate(messages) if is_tool_output(m, patterns)]
    freed = {
        i: counter.count_message(messages[i]) - counter.count_message({**messages[i], "content": PLACEHOLDER})
        for i in outputs
    }
    result = Needs(trace, outputs, {}, freed)
    for u, (request, answer) in enumerate(requests(trace)):
        present = [o for o in outputs if o < len(request)]
        for o in present:
            result.arrival.setdefault(o, u)
        used = tokens(answer) - fixed
        held_by: dict[str, list[int]] = {}
        for o in present:
            for x in used & tokens(messages[o]):
                held_by.setdefault(x, []).append(o)
        result.evidence += len(held_by)
        kept = set(present)
        safe = frozenset().union(*(tokens(m) for i, m in enumerate(request) if i not in kept))
        turn = {x: holders for x, holders in held_by.items() if x not in safe}
        result.need.append(turn)
        for x, holders in turn.items():
            for o in holders:
                result.held.setdefault(o, {}).setdefault(u, []).append(x)
    for o in outputs:
        if o in result.arrival:
            result.death[o] = max(result.stops(o))
    return result


def plan_deaths(sets: list[Needs], budget: float) -> int:
    """Pull each output's end back while the set's lost tokens stay within `budget` × its evidence, the most
    token-turns freed per token lost first (moves losing nothing before any other); returns the tokens lost."""
    allowed = budget * sum(n.evidence for n in sets)
    heap: list[tuple[int, float, int, int, int]] = []

    def push(k: int, o: int) -> None:
        n = sets[k]
        earlier = [s for s in n.stops(o) if s < n.death[o]]
        if not earlier:
            return
        end = earlier[-1]
        saved = n.freed[o] * (n.death[o] - end)
        lost = n.lost_if(o, end)
        heapq.heappush(heap, (lost > 0, -saved / max(lost, 1), k, o, end))

    for k, n in enumerate(sets):
        for o in n.death:
            push(k, o)
    spent = 0
    while heap:
        costly, priority, k, o, end = heapq.heappop(heap)
        n = sets[k]
        lost = n.lost_if(o, end)  # others cleared since it was pushed: it may lose more now
        if (lost > 0, -n.freed[o] * (n.death[o] - end) / max(lost, 1)) > (costly, priority):
            heapq.heappush(heap, (lost > 0, -n.freed[o] * (n.death[o] - end) / max(lost, 1), k, o, end))
            continue
        if spent + lost > allowed:
            continue
        spent += lost
        n.death[o] = end
        push(k, o)
    return spent


def schedule(n: Needs, counter: Counter, d: float) -> list[int]:
    """The turns of the cheapest schedule of epochs in hindsight, each clearing every output dead by then."""
    messages = n.trace.messages
    reqs = [len(r) for r, _ in requests(n.trace)]
    if d >= 1.0:
        return list(range(len(reqs)))
    full = [counter.count_message(m) for m in messages]
    cleared = {o: full[o] - n.freed[o] for o in n.outputs}
    plans = [frozenset(o for o, end in n.death.items() if end <= t) for t in range(len(reqs))]
    prefixes: dict[frozenset[int], list[int]] = {}

    def prefix(state: frozenset[int]) -> list[int]:
        if state not in prefixes:
            sums = [0]
            for i, tokens in enumerate(full):
                sums.append(sums[-1] + (cleared[i] if i in state else tokens))
            prefixes[state] = sums
        return prefixes[state]

    def plain(state: frozenset[int], u: int) -> float:
        sums = prefix(state)
        before = sums[reqs[u - 1]] if u else 0
        return d * before + (sums[reqs[u]] - before)

    def epoch(old: frozenset[int], new: frozenset[int], t: int) -> float:
        first = min(min(new - old), reqs[t - 1] if t else 0)
        shared = prefix(old)[first]
        return d * shared + (prefix(new)[reqs[t]] - shared)

    return cheapest_epochs(plans, plain, epoch)[1]


class _Oracle(Clearing):
    """The clearing planner that knows the future: on a scheduled turn, every output dead by then."""

    def __init__(self, n: Needs, epochs: frozenset[int]) -> None:
        self.n, self.epochs = n, epochs

    def plan(self, draft: Draft, out: list[Message], counts: list[int], *, forced: bool) -> ClearPlan | None:
        turn = draft.replies
        if turn not in self.epochs and not forced:
            return None
        journal, last = draft.journal, len(draft.messages) - 1
        visible, digests = draft.visible_output(out)
        ids = message_ids(visible, digests)
        chosen = [
            (ids[v], i)
            for v, i in enumerate(draft.visible())
            if self.n.death.get(i, len(self.n.need)) <= turn
            and i != last
            and journal.decisions[i].kind not in (CLEARED, DROPPED)
        ]
        if not chosen:
            return None
        return ClearPlan(tuple(mid for mid, _ in chosen), sum(self.n.freed[i] for _, i in chosen))


@contextmanager
def _clairvoyant(n: Needs, epochs: list[int]) -> Iterator[None]:
    """The engine's clearing planner is the oracle for this replay (`pipeline` builds one per request)."""
    before = pipeline.Clearing
    pipeline.Clearing = functools.partial(_Oracle, n, frozenset(epochs))  # type: ignore[misc]
    try:
        yield
    finally:
        pipeline.Clearing = before  # type: ignore[misc]


# The oracle bounds what clearing whole outputs can do: its runs leave the agent's own messages as the client wrote
# them (`policy.agent_message_tokens`, a lever of its own that the default policy's rows include).
_ORACLE_POLICY = {"agent_message_tokens": 0}


def oracle_row(set_name: str, traces: list[Trace], counter: Counter, budget: float) -> dict[str, Any]:
    """The oracle on a set at `budget`: for each d, its schedule replayed through the engine, billed and scored."""
    plans = [needs(t, counter) for t in traces]
    spent = plan_deaths(plans, budget)
    row: dict[str, Any] = {"set": set_name, "setting": f"oracle, lost <= {budget:g}", "planned_lost": spent}
    for d in DISCOUNTS:
        total, billed, direct, epochs = Score(), 0.0, 0.0, 0
        for n in plans:
            turns = schedule(n, counter, d)
            epochs += len(turns)
            with _clairvoyant(n, turns):  # a bound on clearing: the agent's own messages go whole (`_ORACLE_POLICY`)
                r = run(n.trace, replace(policy_for(n.trace), **_ORACLE_POLICY), model(WINDOW, d), counter)
            total.add(score(n.trace, r.requests, WINDOW))
            billed, direct = billed + r.proxied.billed, direct + r.direct.billed
        row[str(d)] = _point(total, billed, direct) | {"epochs": epochs}
    return row


def setting_row(set_name: str, setting: Setting, traces: list[Trace], counter: Counter) -> dict[str, Any]:
    row: dict[str, Any] = {"set": set_name, "setting": setting.name}
    for d in DISCOUNTS:
        total, billed, direct = Score(), 0.0, 0.0
        for trace in traces:
            m = measure(setting, trace, WINDOW, d, counter)
            total.add(m["score"])
            billed, direct = billed + m["billed"], direct + m["direct"]
        row[str(d)] = _point(total, billed, direct)
    return row


def _point(total: Score, billed: float, direct: float) -> dict[str, Any]:
    return {
        "evidence": total.evidence,
        "lost_rate": total.rate,
        "turns_lost3": total.share("lost3"),
        "billed_ratio": billed / direct,
    }


def run_frontier(
    sets: dict[str, list[str | Path]] | None = None, plot: bool = True, only: list[str] | None = None
) -> dict[str, Any]:
    """Every setting (or those named in `only`) and the oracle at lost 0 and within `BUDGET`, on each set."""
    from proxy.tokens.counter import counter_for

    counter = counter_for("o200k_base")
    rows = []
    for set_name, names in (sets or named_sets()).items():
        traces = [load_trace(name) for name in names]
        rows += [setting_row(set_name, s, traces, counter) for s in SETTINGS if not only or s.name in only]
        rows += [oracle_row(set_name, traces, counter, b) for b in (0.0, BUDGET)]
    result: dict[str, Any] = {"rows": rows}
    if plot and importlib.util.find_spec("matplotlib") is not None:
        result["plot"] = str(_plot(rows))
    return result


def _plot(rows: list[dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(dict.fromkeys(r["set"] for r in rows))
    fig, axes = plt.subplots(len(sets), len(DISCOUNTS), figsize=(11, 3.8 * len(sets)), squeeze=False)
    for a, set_name in enumerate(sets):
        for b, d in enumerate(DISCOUNTS):
            ax = axes[a][b]
            for r in rows:
                if r["set"] == set_name:
                    p = r[str(d)]
                    ax.scatter(
                        p["lost_rate"], p["billed_ratio"], marker="*" if r["setting"].startswith("oracle") else "o"
                    )
                    ax.annotate(r["setting"], (p["lost_rate"], p["billed_ratio"]), fontsize=6)
            ax.axhline(0.72 if d == 1.0 else 0.78, color="grey", lw=0.8, ls="--")
            ax.axvline(BUDGET, color="grey", lw=0.8, ls="--")
            ax.set_title(f"{set_name}, 128k, d = {d}", fontsize=9)
            ax.set_xlabel("lost rate", fontsize=8)
            ax.set_ylabel("billed input / direct", fontsize=8)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "frontier.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def render(result: dict[str, Any]) -> str:
    header = ["set", "setting", *(f"d={d}: {c}" for d in DISCOUNTS for c in ("billed", "lost", ">=3 lost"))]
    rows = [
        [
            r["set"],
            r["setting"],
            *(
                v
                for d in DISCOUNTS
                for v in (
                    f"{r[str(d)]['billed_ratio']:.3f}",
                    f"{r[str(d)]['lost_rate']:.3f}",
                    f"{r[str(d)]['turns_lost3']:.3f}",
                )
            ),
        ]
        for r in result["rows"]
    ]
    lines = ["128k; targets d = 1 <= 0.72, d = 0.5 <= 0.78, lost <= 0.04", table(header, rows)]
    if "plot" in result:
        lines.append(f"\nplot: {result['plot']}")
    return "\n".join(lines)
