"""Replay the packaged agent traces direct and through `process`, and bill both with the cache model.

Used by the tests and, as `python -m tests.context.replay`, to print the figures the
policy's defaults were chosen from.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import orjson

from proxy.config.loader import load_settings
from proxy.context.economics import Bill, Block, bill
from proxy.context.journal import Journal
from proxy.context.pipeline import Outcome, process
from proxy.context.policy import ClearPolicy, ModelInfo, Policy
from proxy.context.survival import NO_HISTORY, Lifetimes
from proxy.context.tokens import REPLY_PRIMING, Counter
from proxy.demo.traces import Trace, load_trace, requests
from tests.pairing import check_pairing

TRACE_NAMES = ("sweagent_marshmallow-1867.json", "mini_django-11138.tools.json", "sweagent_text_pydicom-1458.json")
# What marks a user message as tool output for SWE-agent's text mode: the shipped session file's pattern.
TEXT_OBSERVATION = load_settings().policy_for("swe-agent-text-replay")[0].clear_tool_outputs.observation_patterns[0]


def load(name: str) -> Trace:
    return load_trace(name)


def turns(trace: Trace) -> Iterator[list[dict]]:
    """The agent's k-th request: the messages before its k-th assistant message (`proxy.demo.traces.requests`)."""
    return (request for request, _answer in requests(trace))


def agent(steps: int, output_tokens: int = 400, error_every: int = 0) -> list[dict]:
    """A synthetic agent run: system, task, then per step an assistant call and its (distinct) tool output."""
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."}]
    for k in range(steps):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}],
            }
        )
        failed = error_every and k % error_every == 0
        body = f"Error: step {k} failed" if failed else f"step {k} " + "x" * 4 * output_tokens
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": body})
    return messages


def model(window: int, discount: float) -> ModelInfo:
    return ModelInfo(context_window=window, input_per_mtok=1.0, cached_input_per_mtok=discount)


def policy_for(trace: Trace, **overrides: object) -> Policy:
    """The default policy, plus the observation pattern for text-mode traces."""
    base = Policy(**overrides)  # type: ignore[arg-type]
    if trace.messages and not any(m.get("role") == "tool" for m in trace.messages):
        clear = replace(base.clear_tool_outputs, observation_patterns=(TEXT_OBSERVATION,))
        base = replace(base, clear_tool_outputs=clear)
    return base


@dataclass
class Run:
    """A trace through the proxy: every outcome, and the bill of what went upstream."""

    outcomes: list[Outcome] = field(default_factory=list)
    requests: list[list[dict]] = field(default_factory=list)
    proxied: Bill = field(default_factory=Bill)
    direct: Bill = field(default_factory=Bill)
    direct_failures: int = 0


def request_blocks(
    messages: Sequence[dict], count: Sequence[int], tools: object = None, tools_tokens: int = 0
) -> list[Block]:
    """A request as cache blocks: the tools schema first (it precedes the messages in the prompt), then each message."""
    blocks: list[Block] = [(orjson.dumps(tools), tools_tokens)] if tools else []
    blocks.extend((orjson.dumps(m), n) for m, n in zip(messages, count, strict=True))
    return blocks


def _blocks(messages: list[dict], tools: list, counter: Counter) -> list:
    counts = [counter.count_message(m) for m in messages]
    return request_blocks(messages, counts, tools, counter.count_text(json.dumps(tools)) if tools else 0)


def run(
    trace: Trace,
    policy: Policy,
    info: ModelInfo,
    counter: Counter,
    send: Callable[[list[dict]], list[dict]] | None = None,
    lifetimes: Lifetimes = NO_HISTORY,
) -> Run:
    """Replay every turn as the agent sent it; bill direct and proxied requests under `info`'s discount.

    `send`, when given, stands in for the proxy (another tool's policy, replayed the same way): no outcomes.
    `lifetimes`: the agent's history, as the service hands it to the engine (none: the rule without history).
    """
    tools = trace.tools
    result = Run()
    journal = Journal()
    direct = []
    usable = info.context_window - policy.reserve_output_tokens
    for request in turns(trace):
        if send is not None:
            result.requests.append(send(request))
        else:
            outcome = process(
                journal, request, tools=tools, policy=policy, model=info, counter=counter, lifetimes=lifetimes
            )
            result.outcomes.append(outcome)
            journal = outcome.journal
            result.requests.append(outcome.messages)
        blocks = _blocks(request, tools or [], counter)
        direct.append(blocks)
        if sum(n for _, n in blocks) + REPLY_PRIMING > usable:
            result.direct_failures += 1
    proxied = [_blocks(m, tools or [], counter) for m in result.requests]
    result.proxied = bill(proxied, info.cache_discount)
    result.direct = bill(direct, info.cache_discount)
    return result


def problems(run_: Run) -> list[str]:
    """Pairing errors, rejections and altered last messages over a run."""
    found = []
    for k, (outcome, sent) in enumerate(zip(run_.outcomes, run_.requests, strict=True)):
        if outcome.overflow:
            found.append(f"turn {k}: rejected: {outcome.overflow.message()}")
        found += [f"turn {k}: {p}" for p in check_pairing(sent)]
    return found


def main() -> None:
    from proxy.tokens.counter import counter_for

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep-tokens", type=int, default=None)
    parser.add_argument("--soft-budget", type=int, default=0)
    args = parser.parse_args()
    counter = counter_for("o200k_base")
    clear = ClearPolicy() if args.keep_tokens is None else ClearPolicy(keep_tokens=args.keep_tokens)
    print(f"{'trace':34} {'window':>6} {'d':>4} {'direct':>9} {'proxy':>9} {'ratio':>6} {'epochs':>6} fails")
    for window in (128000, 32000):
        for d in (1.0, 0.5, 0.1):
            totals = [0.0, 0.0]
            for name in TRACE_NAMES:
                trace = load(name)
                policy = policy_for(trace, soft_budget_tokens=args.soft_budget, clear_tool_outputs=clear)
                r = run(trace, policy, model(window, d), counter)
                epochs = sum(o.report.epoch for o in r.outcomes)
                totals[0] += r.direct.billed
                totals[1] += r.proxied.billed
                ratio = r.proxied.billed / r.direct.billed
                print(
                    f"{name:34} {window:>6} {d:>4} {r.direct.billed:>9.0f} {r.proxied.billed:>9.0f} {ratio:>6.3f} "
                    f"{epochs:>6} {r.direct_failures}/{len(r.outcomes)} {len(problems(r))}"
                )
            print(f"{'all':34} {window:>6} {d:>4} {totals[0]:>9.0f} {totals[1]:>9.0f} {totals[1] / totals[0]:>6.3f}")


if __name__ == "__main__":
    main()
