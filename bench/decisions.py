"""Whether a change to the engine changed what it decides: a digest of every turn it sends upstream.

`python -m bench decisions` plays every set `bench quality` knows (packaged, held-out, samples A and B, others A
and B) turn by turn through the engine in this process (bench/engine.py, as the server calls it), each run its own
session, under a few settings: the model table's 128k and 1M windows at three cached prices, every window cut to
32k, and `mode = "lossless"`. For each setting it hashes every turn's upstream bytes and X-Context-* headers (a turn
refused for overflow hashes its error). Run it at two revisions: the same digests mean the same bytes went upstream
on every turn, so a change meant to save CPU changed no decision. It measures nothing to tune on: the held-out sets
are played only to be compared with themselves.
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
from proxy.service.engine_service import build_context_service

# gpt-5: 400k window, d = 0.1; gpt-4.1: 1M, d = 0.25; a name only "*" matches: 128k, d = 0.5.
MODELS = ("gpt-5", "gpt-4.1", "bench-unlisted-model")
SETTINGS = ("shipped", "32k", "lossless")


def _settings(name: str) -> Settings:
    settings = replace(load_settings(), path="")
    if name == "32k":
        settings = replace(settings, models=tuple(replace(m, context_window=32_000) for m in settings.models))
    elif name == "lossless":
        settings = replace(settings, policy=policy_from_dict({**settings.policy_data, "mode": "lossless"}))
    return settings


def _play(setting: str, traces: list[str | Path]) -> dict[str, Any]:
    service = build_context_service(ConfigHolder(_settings(setting)))
    digest, turns, epochs = hashlib.sha256(), 0, 0
    started = time.process_time()
    for model in MODELS:
        for name in traces:
            trace, prompt = load_trace(name), 0
            for messages, _ in requests(trace):
                raw = orjson.dumps({"model": model, "messages": messages, "tools": trace.tools})
                turns += 1
                try:
                    turn, _ = handle(service, raw, f"{model} {name}", prompt_tokens=max(1, prompt))
                except Exception as error:  # an overflow the engine refuses: its message is part of the digest
                    digest.update(repr(error).encode())
                    continue
                digest.update(turn.data if turn.data is not None else orjson.dumps(turn.body))
                digest.update(orjson.dumps(turn.headers, option=orjson.OPT_SORT_KEYS))
                report = turn.outcome.report if turn.outcome is not None else None
                prompt = report.tokens_after if report is not None else 0
                epochs += bool(report is not None and report.epoch)
    service.close()
    return {
        "setting": setting,
        "digest": digest.hexdigest()[:16],
        "turns": turns,
        "epochs": epochs,
        "cpu_ms_per_turn": round((time.process_time() - started) * 1e3 / max(1, turns), 3),
    }


def run_decisions() -> dict[str, Any]:
    traces = [name for names in named_sets().values() for name in names]
    return {"traces": len(traces), "rows": [_play(setting, traces) for setting in SETTINGS]}


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{result['traces']} runs, each under {len(MODELS)} models ({', '.join(MODELS)})",
        "",
        "| setting | digest | turns | epochs | CPU ms a turn |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['setting']} | `{row['digest']}` | {row['turns']} | {row['epochs']} | {row['cpu_ms_per_turn']} |"
        )
    return "\n".join(lines)
