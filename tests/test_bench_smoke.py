"""The benchmarks run at toy sizes and report the structure BENCHMARKS.md reads (no timing thresholds)."""

from __future__ import annotations

import math

import pytest

from bench import smoke


@pytest.fixture(scope="module")
def result() -> dict:
    return smoke.run_smoke()


def test_overhead_reports_every_mode_and_target(result: dict) -> None:
    modes = result["overhead"]["modes"]
    assert {(m["stream"], m["concurrency"] > 1) for m in modes} == {
        (False, False),
        (False, True),
        (True, False),
        (True, True),
    }
    for mode in modes:
        assert set(mode["targets"]) == {"direct", "relay", "proxy"}
        for numbers in mode["targets"].values():
            assert numbers["n"] > 0 and numbers["p50_ms"] > 0 and numbers["rps"] > 0
            assert numbers["events_ok"], "every SSE event the simulator sent reached the client"
        assert math.isfinite(mode["throughput_vs_relay"])


def test_streams_are_forwarded_one_for_one(result: dict) -> None:
    forwarding = result["overhead"]["forwarding"]
    assert forwarding["one_for_one"]
    assert forwarding["proxy"]["events"] == forwarding["proxy"]["sent"]


def test_scaling_reports_first_and_warm_cpu_per_size(result: dict) -> None:
    rows = result["scaling"]["rows"]
    assert [r["tokens"] for r in rows] == [2000, 4000]
    for row in rows:
        assert row["first_ms"] > 0 and row["warm_ms"] > 0 and row["reference_ms"] > 0
        assert set(row["warm_phases_ms"]) == {"parse", "prepare", "serialise", "usage"}


def test_memory_reports_idle_sessions_streams_and_slope(result: dict) -> None:
    memory = result["memory"]
    assert memory["idle_rss"]["proxy"] > 0 and memory["idle_rss"]["relay"] > 0
    assert memory["encoding"]["after"] > memory["encoding"]["before"] > 0
    assert memory["sessions"]["conversation_bytes"] > 0 and memory["sessions"]["traced_per_session"] > 0
    assert {"relay", "proxy"} <= set(memory["streams"]) and {"relay", "proxy"} == set(memory["slope"])


def test_savings_replays_direct_and_proxied_at_each_discount(result: dict) -> None:
    rows = result["savings"]["rows"]
    assert {r["model"] for r in rows} == {"sim-32k", "gpt-4o"}
    for row in rows:
        assert row["direct"]["answered"] == row["turns"] == 3
        assert set(row["proxy"]) == {"1.0", "0.5", "0.1"}
        assert all(p["answered"] == 3 and p["billed"] > 0 for p in row["proxy"].values())


def test_profile_names_the_heaviest_functions(result: dict) -> None:
    if "profile" not in result:
        pytest.skip("pyinstrument (bench extra) is not installed")
    profile = result["profile"]
    assert profile["ms_per_turn"] > 0 and profile["top_self"] and profile["top_inclusive"]


def test_stall_reports_the_largest_gap_with_and_without_the_worker_thread(result: dict) -> None:
    stall = result["stall"]
    for mode in ("worker thread", "inline"):
        assert len(stall[mode]) == 1 and stall[mode][0] > 0


def test_ab_compares_an_earlier_commit_with_the_tree_in_both_modes(result: dict) -> None:
    if "ab" not in result:
        pytest.skip("not a git checkout")
    for mode in ("json", "stream"):
        numbers = result["ab"]["modes"][mode]
        assert numbers["old"]["cpu_ms_per_request"] > 0 and numbers["new"]["requests_per_s"] > 0
        assert math.isfinite(numbers["cpu_new_over_old"])
