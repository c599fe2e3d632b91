"""The agent's own messages as a lever (issue 27): a probe of an edit the proxy does not make.

Clearing works on tool outputs; on mini-swe-agent's runs the agent's own messages (its reasoning written out, and
the scripts it writes in its commands) hold as much of the request. For each set this prints the share of each role
in the runs' last requests, then, for keeping the agent's last `keep` messages whole and cutting the prose of older
ones to their first `head` characters (their tool calls kept, as SPEC §3 keeps them when clearing):

- `saves at d = 1`: the tokens cut, summed over every turn's request, over the requests' tokens: the most the
  edit could take off a bill with no cache (no epoch cost, no window);
- what the agent's next message used that stood only in what was cut, nowhere else in the request (its specific
  tokens, outside the system prompt, the task and the tools, as `bench quality` counts them): the share of those
  tokens it used from the request, and the turns where it used 1+ and 3+ of them.

`python -m bench agent-messages` (~5 s, in-process, deterministic).
"""

from __future__ import annotations

from collections import Counter as Tally
from typing import Any

from bench.quality import _never_edited, _Tokens, named_sets
from bench.stats import table
from proxy.context.messages import content_text
from proxy.demo.traces import Trace, load_trace
from proxy.tokens.counter import counter_for
from tests.context.replay import turns

SETS = ("packaged", "sample A", "others A", "held-out", "sample B", "others B")
VARIANTS = ((6, 600), (6, 0), (12, 600), (3, 600))  # (keep, head)


def _cut(message: dict[str, Any], head: int) -> dict[str, Any]:
    text = content_text(message)
    if text is None or len(text) <= head:
        return message
    return {**message, "content": text[:head] + "\n[the rest of this message cut]"}


def _roles(traces: list[Trace], count: Any) -> dict[str, float]:
    shares: Tally[str] = Tally()
    for trace in traces:
        for message in trace.messages:
            shares[str(message.get("role"))] += count(message)
    total = sum(shares.values()) or 1
    return {role: shares[role] / total for role in ("system", "user", "assistant", "tool")}


def _variant(traces: list[Trace], keep: int, head: int, count: Any) -> dict[str, float]:
    sent = cut = used_total = lost_total = turns_seen = lost1 = lost3 = 0
    for trace in traces:
        tokens = _Tokens()
        fixed = _never_edited(trace, tokens)
        requests = list(turns(trace))
        answers = [m for m in trace.messages if m.get("role") == "assistant"]
        for request, answer in zip(requests, answers, strict=False):
            agent = [i for i, m in enumerate(request) if m.get("role") == "assistant"]
            old = agent[: max(0, len(agent) - keep)]
            edited = list(request)
            for i in old:
                edited[i] = _cut(request[i], head)
            sent += sum(count(m) for m in request)
            cut += sum(count(request[i]) - count(edited[i]) for i in old)
            used = (tokens(answer) - fixed) & frozenset().union(*(tokens(m) for m in request))
            if not used:
                continue
            still = frozenset().union(*(tokens(m) for m in edited))
            lost = len(used - still)
            used_total, lost_total, turns_seen = used_total + len(used), lost_total + lost, turns_seen + 1
            lost1, lost3 = lost1 + (lost >= 1), lost3 + (lost >= 3)
    return {
        "saves": cut / sent if sent else 0.0,
        "lost": lost_total / used_total if used_total else 0.0,
        "turns_lost1": lost1 / turns_seen if turns_seen else 0.0,
        "turns_lost3": lost3 / turns_seen if turns_seen else 0.0,
    }


def run_agent_messages(sets: list[str] | None = None) -> dict[str, Any]:
    counter = counter_for("o200k_base")
    memo: dict[int, tuple[dict, int]] = {}

    def count(message: dict[str, Any]) -> int:
        hit = memo.get(id(message))
        if hit is None or hit[0] is not message:
            hit = memo[id(message)] = (message, counter.count_message(message))
        return hit[1]

    rows = []
    for name, names in named_sets(sets or list(SETS)).items():
        traces = [load_trace(n) for n in names]
        row: dict[str, Any] = {"set": name, "roles": _roles(traces, count)}
        row["variants"] = {f"{keep}/{head}": _variant(traces, keep, head, count) for keep, head in VARIANTS}
        rows.append(row)
    return {"rows": rows}


def render(result: dict[str, Any]) -> str:
    names = ("system", "user", "assistant", "tool")
    roles = table(["set", *names], [[r["set"], *(f"{r['roles'][k]:.3f}" for k in names)] for r in result["rows"]])
    cuts = table(
        ["set", "keep last / head chars", "saves at d = 1", "next message's tokens only there", "turns 1+", "turns 3+"],
        [
            [r["set"], v, f"{x['saves']:.3f}", f"{x['lost']:.3f}", f"{x['turns_lost1']:.1%}", f"{x['turns_lost3']:.1%}"]
            for r in result["rows"]
            for v, x in r["variants"].items()
        ],
    )
    return (
        "each role's share of the runs' tokens (every message once)\n"
        f"{roles}\n\nthe agent's older messages cut to their head, tool calls kept (a probe: the proxy makes no such "
        f"edit)\n{cuts}"
    )
