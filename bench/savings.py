"""What the proxy saves: every packaged trace replayed direct and through the proxy against the simulator.

In-process (timing plays no part here): the simulator and the proxy serve in this loop and
an aiohttp client sends each agent request turn by turn. The simulator bills prompt and
cached tokens with its prefix-cache model and refuses requests over the window. Billed input
is in full-price token equivalents, uncached + d × cached, for d = 1, 0.5 and 0.1; the proxy
runs with the model table's cached price set to that d, since its epoch decisions depend on it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.stats import table
from proxy.config.loader import ConfigHolder, load_settings
from proxy.config.settings import Settings
from proxy.demo.simulator import SIMULATOR, SimulatorConfig, start_simulator
from proxy.demo.traces import Trace, list_traces, load_trace, requests
from proxy.dialects.chat import overflow_tokens
from proxy.service.engine_service import build_context_service
from proxy.shell import server

MODELS = {"sim-32k": 32000, "gpt-4o": 128000}
DISCOUNTS = (1.0, 0.5, 0.1)
PLOT_TRACE = "mini_django-11138.tools.json"
PLOT_DISCOUNT = 0.5
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Turn:
    status: int
    prompt: int = 0  # billed prompt tokens; for a refusal, the size the upstream reported
    cached: int = 0
    epoch: bool = False


@dataclass
class Replay:
    turns: list[Turn] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return sum(t.status == 200 for t in self.turns)

    def billed(self, d: float, only: set[int] | None = None) -> float:
        return sum(
            t.prompt - t.cached + d * t.cached
            for i, t in enumerate(self.turns)
            if t.status == 200 and (only is None or i in only)
        )

    def total(self, attr: str) -> int:
        return sum(getattr(t, attr) for t in self.turns if t.status == 200)


async def replay(client: aiohttp.ClientSession, base: str, trace: Trace, model: str, limit: int | None) -> Replay:
    out = Replay()
    headers = {"Authorization": "Bearer sk-bench-savings", "Content-Type": "application/json"}
    for k, (messages, _) in enumerate(requests(trace)):
        if limit is not None and k >= limit:
            break
        body: dict[str, Any] = {"model": model, "messages": messages}
        if trace.tools:
            body["tools"] = trace.tools
        async with client.post(base + "/chat/completions", data=orjson.dumps(body), headers=headers) as response:
            raw = await response.read()
            turn = Turn(response.status, epoch=response.headers.get("X-Context-Epoch") == "1")
        if turn.status == 200:
            usage = orjson.loads(raw)["usage"]
            turn.prompt = usage["prompt_tokens"]
            turn.cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        elif (refused := overflow_tokens(raw)) is not None:  # the size the refused request would have had
            turn.prompt = refused
        out.turns.append(turn)
    return out


def _settings(sim_url: str, d: float) -> Settings:
    """The default config pointed at the simulator, each benchmark model's cached price at d × input."""
    settings = load_settings(upstream_url=sim_url)
    models = tuple(
        replace(m, cached_input_per_mtok=m.input_per_mtok * d) if any(m.pattern.startswith(x) for x in MODELS) else m
        for m in settings.models
    )
    return replace(settings, models=models, path="")  # path "": never reloaded from disk mid-run


def _session_prefix(trace: Trace) -> str:
    """Text-mode traces (no tool messages: SWE-agent's text mode, its CTF runs) run as the shipped
    `proxy/data/config/sessions/swe-agent-text.toml` session, as a user would (`tests.context.replay.policy_for`)."""
    text = trace.messages and not any(m.get("role") == "tool" for m in trace.messages)
    return "swe-agent-text-bench-" if text else "bench-"


async def run_savings(traces: list[str] | None = None, limit: int | None = None, plot: bool = True) -> dict[str, Any]:
    traces = traces or list_traces()
    sim_runner, sim_url = await start_simulator(SimulatorConfig(models=dict(MODELS), record_limit=4))
    sim = sim_runner.app[SIMULATOR]
    rows: list[dict[str, Any]] = []
    plot_data: dict[str, dict[str, Replay]] = {}
    try:
        async with aiohttp.ClientSession() as client:
            for name in traces:
                trace = load_trace(name)
                for model in MODELS:
                    sim.reset()
                    direct = await replay(client, sim_url, trace, model, limit)
                    proxied: dict[float, Replay] = {}
                    for d in DISCOUNTS:
                        holder = ConfigHolder(_settings(sim_url, d))
                        runner, port = await server.start(holder, context=build_context_service(holder))
                        try:
                            sim.reset()
                            session = f"http://127.0.0.1:{port}/s/{_session_prefix(trace)}{time.monotonic_ns()}/v1"
                            proxied[d] = await replay(client, session, trace, model, limit)
                        finally:
                            await runner.cleanup()
                    rows.append(_row(trace, model, direct, proxied))
                    if trace.name == PLOT_TRACE:
                        plot_data[model] = {"direct": direct, "proxy": proxied[PLOT_DISCOUNT]}
    finally:
        await sim_runner.cleanup()
    result: dict[str, Any] = {"rows": rows}
    if plot and plot_data:
        result["plot"] = str(_plot(plot_data))
    return result


def _row(trace: Trace, model: str, direct: Replay, proxied: dict[float, Replay]) -> dict[str, Any]:
    both = {
        d: {i for i, (a, b) in enumerate(zip(direct.turns, p.turns, strict=True)) if a.status == b.status == 200}
        for d, p in proxied.items()
    }
    return {
        "trace": trace.name,
        "model": model,
        "turns": len(direct.turns),
        "direct": {"answered": direct.answered, "prompt": direct.total("prompt"), "cached": direct.total("cached")},
        "proxy": {
            str(d): {
                "answered": p.answered,
                "prompt": p.total("prompt"),
                "cached": p.total("cached"),
                "epochs": sum(t.epoch for t in p.turns),
                "billed": p.billed(d),
                "direct_billed": direct.billed(d),
                "billed_ratio_common_turns": p.billed(d, both[d]) / max(1.0, direct.billed(d, both[d])),
                "common_turns": len(both[d]),
            }
            for d, p in proxied.items()
        },
    }


def _plot(data: dict[str, dict[str, Replay]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(data), 1, figsize=(10, 4 * len(data)), sharex=True)
    for ax, (model, runs) in zip(list(axes) if len(data) > 1 else [axes], data.items(), strict=True):
        direct, proxy = runs["direct"], runs["proxy"]
        xs = range(1, len(direct.turns) + 1)
        ok = [(x, t.prompt) for x, t in zip(xs, direct.turns, strict=True) if t.status == 200]
        refused = [(x, t.prompt) for x, t in zip(xs, direct.turns, strict=True) if t.status != 200 and t.prompt]
        ax.plot([x for x, _ in ok], [y for _, y in ok], color="tab:gray", label="direct: prompt tokens")
        if refused:
            ax.scatter(*zip(*refused, strict=True), marker="x", color="tab:red", s=12, label="direct: refused (size)")
        ax.plot(xs, [t.prompt for t in proxy.turns], color="tab:blue", label="proxy: prompt tokens")
        ax.plot(xs, [t.cached for t in proxy.turns], color="tab:blue", ls="--", lw=0.8, label="proxy: cached tokens")
        for x, t in zip(xs, proxy.turns, strict=True):
            if t.epoch:
                ax.axvline(x, color="tab:orange", lw=0.6, ls=":")
        ax.axhline(MODELS[model], color="black", lw=0.6, label=f"window {MODELS[model]:,}")
        ax.plot([], [], color="tab:orange", ls=":", label="proxy epoch (X-Context-Epoch)")
        ax.set_title(f"{PLOT_TRACE} on {model} (d = {PLOT_DISCOUNT})")
        ax.set_ylabel("tokens per turn")
        ax.legend(fontsize=7, loc="upper left")
    axes_list = list(axes) if len(data) > 1 else [axes]
    axes_list[-1].set_xlabel("turn")
    fig.tight_layout()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "savings_mini_django.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def render(result: dict[str, Any]) -> str:
    rows = []
    for r in result["rows"]:
        for d, p in r["proxy"].items():
            rows.append(
                [
                    r["trace"].split(".")[0], r["model"], d, r["turns"], r["direct"]["answered"], p["answered"],
                    r["direct"]["prompt"], p["prompt"], r["direct"]["cached"], p["cached"], p["epochs"],
                    p["direct_billed"], p["billed"], p["billed"] / max(1.0, p["direct_billed"]),
                    p["billed_ratio_common_turns"],
                ]
            )  # fmt: skip
    header = [
        "trace", "model", "d", "turns", "ok direct", "ok proxy", "prompt direct", "prompt proxy", "cached direct",
        "cached proxy", "epochs", "billed direct", "billed proxy", "proxy/direct", "proxy/direct (turns both ok)",
    ]  # fmt: skip
    lines = ["billed = uncached + d x cached prompt tokens (full-price token equivalents); refused turns bill 0"]
    lines.append(table(header, rows))
    if "plot" in result:
        lines.append(f"\nplot: {result['plot']}")
    return "\n".join(lines)
