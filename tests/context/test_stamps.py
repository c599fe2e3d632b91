"""Stamps a tool puts on each run (Codex's chunk id and wall time, pytest's duration) are seen through by dedup."""

from __future__ import annotations

from proxy.context import HeuristicCounter, ModelInfo, Policy
from proxy.context.dedup import body_digest
from proxy.context.journal import Journal
from proxy.context.pipeline import process
from proxy.context.stamps import unstamped

SEQ = "\n".join(str(n) for n in range(1, 20001)) + "\n"


def codex_output(chunk: str, wall: str, body: str = SEQ, status: str = "Process exited with code 0") -> str:
    """What Codex 0.171.0 sends as an exec_command's function_call_output (recorded from the real binary)."""
    head = f"Chunk ID: {chunk}\nWall time: {wall} seconds\n{status}\nOriginal token count: 27224\nOutput:\n"
    return head + body


def tool(call_id: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def test_codex_header_stamps_are_dropped_and_the_rest_kept() -> None:
    first, second = codex_output("b2fb44", "0.1802"), codex_output("914ec5", "0.0385")
    assert first != second and unstamped(first) == unstamped(second)
    assert unstamped(first) == "Process exited with code 0\nOriginal token count: 27224\nOutput:\n" + SEQ
    running = codex_output("aa11", "10.0", status="Process running with session ID 7")
    assert unstamped(running) == unstamped(codex_output("bb22", "10.0", status="Process running with session ID 9"))
    assert unstamped(codex_output("a", "1", status="Process exited with code 1")) != unstamped(first)  # not a stamp


def test_only_where_the_tool_puts_them() -> None:
    body = "Output:\nChunk ID: b2fb44\nWall time: 0.1 seconds\n"  # the command printed these: its output
    assert (
        unstamped("Chunk ID: 1\nWall time: 0.2 seconds\nno output line\n")
        == "Chunk ID: 1\nWall time: 0.2 seconds\nno output line\n"
    )
    assert unstamped(codex_output("c0ffee", "0.5", body=body)).endswith(body)
    assert unstamped("Wed Dec  2 07:20:50 UTC 2026\n") == "Wed Dec  2 07:20:50 UTC 2026\n"  # `date` prints its output


def test_pytest_closing_duration_is_a_stamp() -> None:
    run = "tests/test_x.py ...F\n=================== 1 failed, 3 passed in {}s ===================\n"
    assert (
        unstamped(run.format("0.12")) == unstamped(run.format("3.40")) != unstamped(run.replace("1 failed", "2 failed"))
    )
    assert unstamped("==== 4 passed in 61.02s (0:01:01) ====") == unstamped("==== 4 passed in 59.90s (0:00:59) ====")


def test_two_identical_seq_outputs_from_codex_dedup() -> None:
    assert body_digest(tool("a", codex_output("b2fb44", "0.18"))) == body_digest(
        tool("b", codex_output("914ec5", "0.03"))
    )
    calls = [{"id": c, "type": "function", "function": {"name": "exec_command", "arguments": "{}"}} for c in "ab"]
    messages = [
        {"role": "developer", "content": "You are Codex."},
        {"role": "user", "content": "Count to 20000 twice."},
        {"role": "assistant", "content": None, "tool_calls": calls[:1]},
        tool("a", codex_output("b2fb44", "0.1802")),
        {"role": "assistant", "content": None, "tool_calls": calls[1:]},
        tool("b", codex_output("914ec5", "0.0385")),
        {"role": "user", "content": "Done?"},
    ]
    outcome = process(
        Journal(),
        messages,
        tools=None,
        policy=Policy(),
        model=ModelInfo(context_window=200000),
        counter=HeuristicCounter(),
    )
    assert outcome.messages[5]["content"] == "[same output as call a above]"
    assert outcome.messages[3] == messages[3]
