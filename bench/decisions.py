"""Whether a change to the engine changed what it decides: a digest of every turn it sends upstream.

`python -m bench decisions` plays the sets in `SETS` (packaged, held-out, samples A and B, others A and B: not
sample C, drawn after the digests were first taken) turn by turn through the engine in this process
(bench/engine.py, as the server calls it), each run its own session, under a few settings: the model table's 128k
and 1M windows at three cached prices, every window cut to 32k, and `mode = "lossless"`; as Messages bodies
(`proxy.demo.traces_messages`: Claude Code's breakpoints, and none) on two Claude models; and as Responses bodies
(`proxy.demo.traces_responses`, as Codex sends them). For each setting and API it hashes every turn's upstream bytes
and X-Context-* headers (a turn refused for overflow hashes its error). Run it at two revisions: the same digests
mean the same bytes went upstream on every turn, so a change meant to save CPU changed no decision. It measures
nothing to tune on: the held-out sets are played only to be compared with themselves.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from bench.engine import handle
from bench.quality import named_sets
from proxy.config.loader import ConfigHolder, load_settings
from proxy.config.settings import Settings
from proxy.context.policy import policy_from_dict
from proxy.demo.traces import load_trace, requests
from proxy.demo.traces_messages import BREAKPOINT_STYLES, messages_requests
from proxy.demo.traces_responses import responses_requests
from proxy.dialects import CHAT, MESSAGES, RESPONSES, Dialect
from proxy.service.engine_service import build_context_service

# gpt-5: 400k window, d = 0.1; gpt-4.1: 1M, d = 0.25; a name only "*" matches: 128k, d = 0.5.
MODELS = ("gpt-5", "gpt-4.1", "bench-unlisted-model")
CLAUDE_MODELS = ("claude-sonnet-4-5", "claude-sim-32k")  # 200k and 32k, reads 0.1x, writes 1.25x
RESPONSES_MODELS = ("gpt-5", "bench-unlisted-model")  # as Codex sends them
DIALECTS = {"chat": CHAT, "messages": MESSAGES, "responses": RESPONSES}
SETTINGS = ("shipped", "32k", "lossless")
# The sets the digests are taken over (sample C, drawn later, is left out so digests stay comparable across commits).
SETS = ("packaged", "held-out", "sample A", "sample B", "others A", "others B")


def _settings(name: str) -> Settings:
    settings = replace(load_settings(), path="")
    if name == "32k":
        settings = replace(settings, models=tuple(replace(m, context_window=32_000) for m in settings.models))
    elif name == "lossless":
        settings = replace(settings, policy=policy_from_dict({**settings.policy_data, "mode": "lossless"}))
    return settings


def _bodies(api: str, name: str | Path) -> list[tuple[str, bytes]]:
    """Each turn's (model, body) of a run, for chat under `MODELS`, or as Messages under `CLAUDE_MODELS` and each
    breakpoint style."""
    trace = load_trace(name)
    if api == "chat":
        return [
            (model, orjson.dumps({"model": model, "messages": messages, "tools": trace.tools}))
            for model in MODELS
            for messages, _ in requests(trace)
        ]
    if api == "responses":
        return [(model, orjson.dumps(body)) for model in RESPONSES_MODELS for body in responses_requests(trace, model)]
    return [
        (f"{model} {style}", orjson.dumps(body))
        for model in CLAUDE_MODELS
        for style in BREAKPOINT_STYLES
        for body in messages_requests(trace, model, style)
    ]


def _turn(service: Any, dialect: Dialect, raw: bytes, session: str, prompt: int) -> Any:
    """One turn as the server runs it (chat: bench.engine's), its usage learned."""
    if dialect is CHAT:
        return handle(service, raw, session, prompt_tokens=prompt)[0]
    turn = service.prepare(
        path_session=session, headers={}, body=dialect.parse(raw), credential="sk-bench", dialect=dialect
    )
    usage = {"input_tokens": prompt, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
    turn.record_usage([{"usage": {**usage, "input_tokens_details": {"cached_tokens": 0}}}])
    return turn


def _play(setting: str, api: str, traces: list[str | Path]) -> dict[str, Any]:
    service = build_context_service(ConfigHolder(_settings(setting)))
    dialect = DIALECTS[api]
    digest, turns, epochs = hashlib.sha256(), 0, 0
    started = time.process_time()
    for name in traces:
        prompt, last = 0, ""
        for run, raw in _bodies(api, name):
            if run != last:
                prompt, last = 0, run
            turns += 1
            try:
                turn = _turn(service, dialect, raw, f"{run} {Path(name).name}", max(1, prompt))  # not where the tree is
            except Exception as error:  # an overflow the engine refuses: its message is part of the digest
                digest.update(repr(error).encode())
                continue
            digest.update(turn.data if getattr(turn, "data", None) is not None else orjson.dumps(turn.body))
            digest.update(orjson.dumps(turn.headers, option=orjson.OPT_SORT_KEYS))
            report = turn.outcome.report if turn.outcome is not None else None
            prompt = report.tokens_after if report is not None else 0
            epochs += bool(report is not None and report.epoch)
    service.close()
    return {
        "setting": setting,
        "api": api,
        "digest": digest.hexdigest()[:16],
        "turns": turns,
        "epochs": epochs,
        "cpu_ms_per_turn": round((time.process_time() - started) * 1e3 / max(1, turns), 3),
    }


def run_decisions() -> dict[str, Any]:
    traces = [name for names in named_sets(list(SETS)).values() for name in names]
    rows = [_play(setting, api, traces) for api in DIALECTS for setting in SETTINGS]
    return {"traces": len(traces), "rows": rows}


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{result['traces']} runs; chat under {', '.join(MODELS)}; Messages under {', '.join(CLAUDE_MODELS)}, "
        f"each with {' and '.join(BREAKPOINT_STYLES)} breakpoints; Responses under {', '.join(RESPONSES_MODELS)}",
        "",
        "| API | setting | digest | turns | epochs | CPU ms a turn |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        cells = (row["api"], row["setting"], f"`{row['digest']}`", row["turns"], row["epochs"], row["cpu_ms_per_turn"])
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines)
