"""The packaged traces, the demo's replay, and `context-proxy demo` end to end."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import openai
import pytest

from proxy.context.policy import ModelInfo
from proxy.demo.replay import ReplayResult, main, replay
from proxy.demo.simulator import SIMULATOR, SimulatorConfig, start_simulator
from proxy.demo.traces import list_traces, load_trace, requests


def test_the_three_packaged_traces_are_listed_and_load():
    assert list_traces() == [
        "mini_django-11138.tools.json",
        "sweagent_marshmallow-1867.json",
        "sweagent_text_pydicom-1458.json",
    ]
    django = load_trace("mini_django")
    assert django.name == "mini_django-11138.tools.json" and django.tools[0]["function"]["name"] == "bash"
    assert django.source.startswith("gruckion/mini-swe-agent@") and django.turns == 115
    assert load_trace("sweagent_text_pydicom-1458").tools is None  # text mode: no tools schema


def test_a_trace_file_outside_the_package_loads_by_path(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"source": "here", "messages": [{"role": "user", "content": "hi"}]}))
    trace = load_trace(str(path))
    assert trace.name == "mine.json" and trace.turns == 0
    with pytest.raises(ValueError, match="packaged traces"):
        load_trace("no-such-trace")
    with pytest.raises(ValueError, match="sweagent"):  # ambiguous: two names contain it
        load_trace("sweagent")


def test_each_request_is_the_history_before_an_assistant_answer():
    trace = load_trace("marshmallow")
    turns = list(requests(trace))
    answers = [i for i, m in enumerate(trace.messages) if m["role"] == "assistant"]
    assert len(turns) == len(answers) == 13
    for (messages, answer), i in zip(turns, answers, strict=True):
        assert messages == trace.messages[:i] and answer is trace.messages[i]
    assert all(messages[-1]["role"] != "assistant" for messages, _ in turns)


def test_billed_input_prices_cached_tokens_at_the_cached_rate():
    result = ReplayResult("x", usage=[(1_000_000, 0), None, (1_000_000, 500_000)])
    model = ModelInfo(input_per_mtok=2.0, cached_input_per_mtok=0.5)
    assert result.prompt_tokens == 2_000_000 and result.cached_tokens == 500_000
    assert result.billed_input(model) == pytest.approx(2.0 + 1.0 + 0.25)
    assert result.billed_input(model, turns=1) == pytest.approx(2.0)


async def test_a_direct_replay_on_a_small_window_counts_the_refused_turns():
    runner, url = await start_simulator(SimulatorConfig(models={"sim-8k": 8000}))
    try:
        result = await replay(url, load_trace("marshmallow"), "sim-8k", "direct")
        totals = runner.app[SIMULATOR].totals
    finally:
        await runner.cleanup()
    assert result.turns == 13 and 0 < result.failed == totals.refused < 13
    assert result.usage[result.first_failure - 1] is None and all(result.usage[: result.first_failure - 1])
    assert (result.prompt_tokens, result.cached_tokens) == (totals.prompt_tokens, totals.cached_tokens)
    assert 0 < result.cached_tokens < result.prompt_tokens


def test_the_demo_replays_through_the_proxy_and_prints_its_table(capsys):
    assert main(["--turns", "70"]) == 0
    out, err = capsys.readouterr()
    progress = [line.strip() for line in err.splitlines()]  # the replay as it goes, never a long silence
    assert [p for p in progress if p.startswith("direct:")] == [
        "direct: turn 25/70",
        "direct: turn 50/70",
        "direct: turn 70/70",
    ]
    assert "via proxy: turn 70/70" in progress
    rows = {m[1].strip(): m[2].split() for m in re.finditer(r"^  (\S[\w ()-]+?)\s{2,}(.+)$", out, re.M)}
    assert any(line.split() == ["direct", "via", "proxy"] for line in out.splitlines())
    assert rows["turns sent"] == ["70", "70"]
    direct_failed, proxy_failed = (int(n) for n in rows["turns failed (window)"])
    assert direct_failed > 0 and proxy_failed == 0
    assert "X-Context-Tokens-Before:" in out and "X-Context-Tokens-After:" in out
    # The like-for-like row compares the turns both answered; the totals say how many turns they cover.
    same = next(line.split() for line in out.splitlines() if "input $, same turns 1-" in line)
    assert float(same[-1].strip("$")) < float(same[-2].strip("$"))
    answered = next(line for line in out.splitlines() if "input $, turns it answered" in line)
    assert answered.endswith("(70)") and f"({70 - direct_failed})" in answered


async def test_a_direct_responses_replay_counts_streamed_refusals_as_failed_turns():
    runner, url = await start_simulator(SimulatorConfig(models={"sim-8k": 8000}))
    try:
        result = await replay(url, load_trace("marshmallow"), "sim-8k", "direct", api="responses")
        totals = runner.app[SIMULATOR].totals
    finally:
        await runner.cleanup()
    assert result.turns == 13 and 0 < result.failed == totals.refused < 13
    assert (result.prompt_tokens, result.cached_tokens) == (totals.prompt_tokens, totals.cached_tokens)


def test_the_demo_replays_the_responses_api_through_the_proxy(capsys):
    assert main(["--api", "responses", "--turns", "60"]) == 0
    out = capsys.readouterr().out
    rows = {m[1].strip(): m[2].split() for m in re.finditer(r"^  (\S[\w ()-]+?)\s{2,}(.+)$", out, re.M)}
    direct_failed, proxy_failed = (int(n) for n in rows["turns failed (window)"])
    assert direct_failed > 0 and proxy_failed == 0


def test_the_demo_replays_anthropic_messages_through_the_proxy(capsys):
    assert main(["--api", "messages", "--turns", "60"]) == 0
    out = capsys.readouterr().out
    rows = {m[1].strip(): m[2].split() for m in re.finditer(r"^  (\S[\w ()-]+?)\s{2,}(.+)$", out, re.M)}
    direct_failed, proxy_failed = (int(n) for n in rows["turns failed (window)"])
    assert direct_failed > 0 and proxy_failed == 0


def test_demo_lists_its_traces(capsys):
    assert main(["--list"]) == 0
    assert capsys.readouterr().out.split() == list_traces()


def test_simulate_serves_an_upstream_the_sdk_can_talk_to() -> None:
    """`context-proxy simulate`: the keyless upstream a new user tries the proxy against."""
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "simulate", "--port", "0", "--delay-ms", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = process.stdout.readline().split(" on ", 1)[1].split()[0]
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=10)
        answer = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content
        process.terminate()  # SIGTERM, what `docker stop` sends: a clean stop, not death by signal (-15)
        assert process.wait(timeout=10) == 0
    finally:
        process.kill()
        process.wait(timeout=10)
