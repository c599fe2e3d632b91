"""Session identity (SPEC §2) and the bounded, optionally persistent session store."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import pytest

from proxy.config.settings import StateConfig
from proxy.context.economics import input_cost_usd
from proxy.context.journal import TurnReport
from proxy.context.policy import ModelInfo
from proxy.dialects import CHAT
from proxy.state import SessionStore, SqliteStore, store_from_config
from proxy.state.sessions import (
    MAX_ID_LENGTH,
    MAX_TURNS_KEPT,
    Session,
    TurnStats,
    agent_fingerprint,
    sanitize_session_id,
    session_id_for,
)

SYSTEM = {"role": "system", "content": "You are a coding agent."}
TASK = {"role": "user", "content": "Fix the failing test."}


class FakeJournal:
    """Stands in for the engine's Journal: only to_dict/from_dict matter to the store."""

    def __init__(self, entries: list[Any] | None = None) -> None:
        self.entries = entries or []

    def to_dict(self) -> dict[str, Any]:
        return {"entries": self.entries}

    def summary(self) -> dict[str, Any]:
        return {"epochs": len(self.entries)}

    def approx_bytes(self) -> int:
        return 100 * len(self.entries)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FakeJournal:
        return cls(list(data["entries"]))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_store(**kwargs: Any) -> SessionStore:
    cls = SqliteStore if "path" in kwargs else SessionStore
    return cls(new_journal=FakeJournal, journal_from_dict=FakeJournal.from_dict, **kwargs)


def body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": list(messages), **extra}


def sid(path: str | None, headers: dict[str, str], request: dict[str, Any], credential: str) -> str:
    """The session id the chat route resolves for this request."""
    return session_id_for(path, headers, CHAT.session_hints(headers, request), credential, CHAT.conversation(request))


def test_path_session_comes_first() -> None:
    got = sid("from-path", {"X-Session-Id": "from-header"}, body(TASK, metadata={"session_id": "m"}), "k")
    assert got == "from-path"


def test_header_then_metadata_then_fingerprint() -> None:
    assert sid(None, {"x-session-id": "h"}, body(TASK, metadata={"session_id": "m"}), "k") == "h"
    assert sid(None, {}, body(TASK, metadata={"session_id": "m"}), "k") == "m"
    assert sid(None, {}, body(SYSTEM, TASK), "k").startswith("fp-")


def test_fingerprint_is_stable_as_the_conversation_grows() -> None:
    first = sid(None, {}, body(SYSTEM, TASK), "key-a")
    later = sid(None, {}, body(SYSTEM, TASK, {"role": "assistant", "content": "ok"}, TASK), "key-a")
    assert first == later


def test_two_users_with_the_same_prompts_get_different_sessions() -> None:
    same = body(SYSTEM, TASK)
    assert sid(None, {}, same, "key-a") != sid(None, {}, same, "key-b")


def test_a_different_task_is_a_different_session() -> None:
    other = {"role": "user", "content": "Write the docs."}
    assert sid(None, {}, body(SYSTEM, TASK), "k") != sid(None, {}, body(SYSTEM, other), "k")


def test_unusable_ids_fall_through_to_the_next_source() -> None:
    assert sid("", {"X-Session-Id": " \t"}, body(TASK, metadata={"session_id": 42}), "k").startswith("fp-")
    assert sid(None, {}, body(TASK, metadata="not a dict"), "k").startswith("fp-")


def test_ids_are_printable_and_capped_without_collisions() -> None:
    assert sanitize_session_id("agent-1") == "agent-1"
    dirty = sanitize_session_id("agent\r\n1")
    assert dirty is not None and dirty.startswith("agent1~") and dirty != "agent1"
    long_a, long_b = sanitize_session_id("a" * 500 + "x"), sanitize_session_id("a" * 500 + "y")
    assert long_a and long_b and long_a != long_b
    assert len(long_a) <= MAX_ID_LENGTH and long_a.isprintable()
    assert sanitize_session_id("\x00\x01") is None


def test_cost_counts_cached_tokens_at_the_cached_price() -> None:
    model = ModelInfo(input_per_mtok=2.0, cached_input_per_mtok=0.5)
    assert input_cost_usd(model, 1_000_000, 0) == pytest.approx(2.0)
    assert input_cost_usd(model, 1_000_000, 600_000) == pytest.approx(0.8 + 0.3)


def test_cost_counts_cache_writes_at_the_write_price() -> None:
    model = ModelInfo(input_per_mtok=2.0, cached_input_per_mtok=0.2, cache_write_per_mtok=2.5)
    assert input_cost_usd(model, 1_000_000, 500_000, 300_000) == pytest.approx(0.4 + 0.1 + 0.75)
    assert ModelInfo(input_per_mtok=2.0).write_price == 2.0


def test_session_report_has_no_message_text() -> None:
    session = Session(id="s", journal=FakeJournal())
    session.add_turn(TurnStats(report=TurnReport(turn=1, tokens_before=10, tokens_after=8), prompt_tokens=9))
    assert session.summary() == {
        "id": "s",
        "key": "s",
        "policy": "default",
        "api": "chat",
        "model": "",
        "turns": 1,
        "tokens_before": 10,
        "tokens_after": 8,
        "last_seen": 0.0,
        "cost_usd": 0.0,
        "direct_cost_usd": 0.0,
        "saved_usd": 0.0,
        "tokens_before_total": 0,
        "tokens_after_total": 0,
        "billed_tokens": 0,
        "billed_cached_tokens": 0,
        "overflows_rescued": 0,
        "epochs": 0,
    }
    assert session.to_dict()["turn_details"][0]["prompt_tokens"] == 9


def test_store_evicts_the_least_recently_seen_beyond_max_sessions() -> None:
    clock = Clock()
    store = make_store(max_sessions=2, clock=clock)
    for sid in ("a", "b"):
        store.get(sid)
        clock.now += 1
    store.get("a")  # "b" is now the least recently seen
    clock.now += 1
    store.get("c")
    assert "a" in store and "c" in store and "b" not in store
    assert len(store) == 2


def test_store_forgets_sessions_idle_past_the_ttl() -> None:
    clock = Clock()
    store = make_store(idle_ttl_s=60, clock=clock)
    store.get("old").journal.entries.append("x")
    clock.now += 30
    store.get("young")
    clock.now += 40  # "old" idle 70 s, "young" 40 s
    store.get("other")
    assert "old" not in store and "young" in store
    assert store.get("old").journal.entries == []


def test_sqlite_keeps_journals_across_a_restart(tmp_path) -> None:
    path = tmp_path / "state.sqlite"
    store = make_store(path=path)
    session = store.get("agent-1")
    session.journal.entries.extend(["kept", "cleared"])
    session.policy = "agents"
    session.correction = 1.07
    session.add_turn(
        TurnStats(report=TurnReport(turn=1, tokens_before=130, tokens_after=120), prompt_tokens=120, cached_tokens=64)
    )
    store.save(session)
    store.close()

    again = make_store(path=path).get("agent-1")
    assert again.journal.entries == ["kept", "cleared"]
    assert (again.policy, again.correction, again.turn_count) == ("agents", 1.07, 1)
    assert again.turns[0].cached_tokens == 64


def test_cost_totals_cover_every_turn_though_details_are_bounded(tmp_path) -> None:
    path = tmp_path / "state.sqlite"
    store = make_store(path=path)
    session = store.get("agent-long")
    for turn in range(MAX_TURNS_KEPT + 50):
        session.add_turn(TurnStats(report=TurnReport(turn, 10, 8), cost_usd=0.01, direct_cost_usd=0.02))
        session.cost_usd += 0.01
        session.direct_cost_usd += 0.02
    store.save(session)
    store.close()

    again = make_store(path=path).get("agent-long")
    assert len(again.turns) == MAX_TURNS_KEPT and again.turn_count == MAX_TURNS_KEPT + 50
    report = again.to_dict()
    assert report["cost_usd"] == pytest.approx(0.01 * (MAX_TURNS_KEPT + 50))
    assert report["saved_usd"] == pytest.approx(0.01 * (MAX_TURNS_KEPT + 50))


def test_session_totals_cover_every_billed_turn_across_a_restart(tmp_path) -> None:
    path = tmp_path / "state.sqlite"
    store = make_store(path=path)
    session = store.get("agent-long")
    for turn in range(MAX_TURNS_KEPT + 50):
        report = TurnReport(turn, 9000, 6000, over_window=turn % 10 == 0)
        stats = TurnStats(report=report, prompt_tokens=6100, cached_tokens=5000, cost_usd=0.01, direct_cost_usd=0.02)
        session.add_turn(stats)
        session.count_usage(stats)
    store.save(session)
    store.close()

    row = make_store(path=path).get("agent-long").summary()
    turns = MAX_TURNS_KEPT + 50
    assert (row["tokens_before_total"], row["tokens_after_total"]) == (9000 * turns, 6000 * turns)
    assert (row["billed_tokens"], row["billed_cached_tokens"]) == (6100 * turns, 5000 * turns)
    assert row["overflows_rescued"] == 15
    assert row["saved_usd"] == pytest.approx(0.01 * turns)


def test_a_state_file_from_before_the_totals_opens_with_its_sessions_and_totals_at_zero(tmp_path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE sessions (id TEXT PRIMARY KEY, policy TEXT NOT NULL, last_seen REAL NOT NULL, "
            "correction REAL NOT NULL, direct_prompt_tokens INTEGER NOT NULL, turn_count INTEGER NOT NULL, "
            "cost_usd REAL NOT NULL, direct_cost_usd REAL NOT NULL, journal BLOB NOT NULL, turns BLOB NOT NULL)"
        )
        db.execute(
            "INSERT INTO sessions VALUES ('old', 'default', ?, 1.0, 0, 3, 0.5, 0.75, ?, '[]')",
            (time.time(), b'{"entries": []}'),
        )

    store = make_store(path=path)
    old = store.get("old")
    assert (old.turn_count, old.cost_usd, old.tokens_before_total) == (3, 0.5, 0)
    stats = TurnStats(report=TurnReport(4, 100, 80), prompt_tokens=80, cost_usd=0.1, direct_cost_usd=0.1)
    old.count_usage(stats)
    store.save(old)
    store.close()
    assert make_store(path=path).get("old").summary()["tokens_after_total"] == 80


def test_the_file_keeps_the_same_sessions_as_memory_least_recent_out_first(tmp_path) -> None:
    clock = Clock()
    store = make_store(path=tmp_path / "s.sqlite", max_sessions=2, clock=clock)
    for sid in ("a", "b", "c"):
        session = store.get(sid)
        session.journal.entries.append(f"decision-{sid}")
        store.save(session)
        clock.now += 1
    store.close()
    again = make_store(path=tmp_path / "s.sqlite", max_sessions=2, clock=clock)
    assert sorted(s.id for s in again) == ["b", "c"]
    assert again.get("b").journal.entries == ["decision-b"]


def test_expired_rows_are_deleted_from_the_file(tmp_path) -> None:
    clock = Clock()
    store = make_store(path=tmp_path / "s.sqlite", idle_ttl_s=60, clock=clock)
    store.save(store.get("a"))
    clock.now += 120
    store.get("b")
    assert store.peek("a") is None
    store.close()
    assert make_store(path=tmp_path / "s.sqlite", idle_ttl_s=1e9, clock=clock).peek("a") is None


def test_from_config_takes_the_state_section(tmp_path) -> None:
    store = store_from_config(StateConfig(max_sessions=3, idle_ttl_s=5, path=str(tmp_path / "x.db")))
    assert (store.max_sessions, store.idle_ttl_s, store.persistent) == (3, 5, True)


def test_saving_a_long_session_is_cheap(tmp_path) -> None:
    store = make_store(path=tmp_path / "s.sqlite")
    session = store.get("long")
    session.journal.entries.extend({"digest": "ab" * 16, "action": "kept", "tokens": 100} for _ in range(2000))
    start = time.perf_counter()
    for _ in range(20):
        store.save(session)
    assert (time.perf_counter() - start) / 20 < 0.02


def test_an_agent_fingerprint_kept_in_a_body_memos_notes_is_the_one_computed_afresh() -> None:
    """The notes come back while the tools are the same: the fingerprint is reused only for the same system prompt."""
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    body = {"model": "m", "tools": tools, "messages": [SYSTEM, TASK]}
    notes: dict[str, Any] = {}
    first = agent_fingerprint("key", CHAT.conversation(body), notes)
    assert first == agent_fingerprint("key", CHAT.conversation(body))
    assert agent_fingerprint("key", CHAT.conversation(body), notes) == first
    other = {"role": "system", "content": "You are a reviewer."}
    changed = {**body, "messages": [other, TASK]}  # the notes of the same tools, another system prompt
    assert (
        agent_fingerprint("key", CHAT.conversation(changed), notes)
        == agent_fingerprint("key", CHAT.conversation(changed))
        != first
    )
    late = {**body, "messages": [TASK, SYSTEM]}  # no system prompt first, one arriving later
    assert agent_fingerprint("key", CHAT.conversation({**body, "messages": [TASK]}), notes) != first
    assert agent_fingerprint("key", CHAT.conversation(late), notes) == agent_fingerprint("key", CHAT.conversation(late))
