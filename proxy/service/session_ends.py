"""Sessions that finish: after `[policy] session_end_idle_s` without a request a session counts as finished, its
length joins its agent's history (`proxy.state.lifetimes`), and the engine prices edits by that history
(`proxy.context.survival.Lifetimes`, handed to it per turn by `lifetimes`).

The sweep runs on the loop, over this process's copies of the sessions, at most every min(30 s, a quarter of
`session_end_idle_s`), when a request or a `/sessions/{id}` comes (an idle proxy runs no task); the clock and
the store live here, the estimate stays pure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from proxy.config.loader import ConfigHolder
from proxy.context.survival import NO_HISTORY, Lifetimes
from proxy.state.memory import SessionStore
from proxy.state.sessions import Session, visible_id

log = logging.getLogger("proxy.service")

MAX_SWEEP_S = 30.0  # the sweep runs at least this often, more often when sessions end sooner


class SessionEnds:
    """Which sessions have finished, and each agent's estimate of the turns to come."""

    def __init__(self, holder: ConfigHolder, store: SessionStore, clock: Callable[[], float] = time.time) -> None:
        self.holder = holder
        self.store = store
        self.clock = clock
        self._estimates: dict[str, Lifetimes] = {}  # agent -> its estimate as of the last sweep
        self._task: asyncio.Task[None] | None = None  # the sweep running in the background, if one is
        self._swept_at = time.monotonic()

    def lifetimes(self, agent: str) -> Lifetimes:
        """The agent's estimate (as of the last sweep; from the stored history alone before one)."""
        known = self._estimates.get(agent)
        if known is None:
            history = self.store.history
            lengths = history.lengths(agent)
            known = Lifetimes.of(lengths, reach=history.reach(agent)) if lengths else NO_HISTORY
            if len(self._estimates) < 4 * self.store.history.max_agents:
                self._estimates[agent] = known
        return known

    def describe(self, report: dict[str, Any]) -> dict[str, Any]:
        """A `/sessions/{id}` body with the turns its agent's history predicts to come, how many finished
        sessions that rests on (`turns_to_come` None: no history says), and how far back they reached (the
        share of what they used that only older outputs held) and whether clearing trusts the agent to work
        from the newest output (`reach.Reach`)."""
        agent, turns = report.get("agent") or "", int(report.get("turns") or 0)
        estimate = self.lifetimes(agent) if agent else NO_HISTORY
        ahead = estimate.turns_to_come(turns) if turns else None
        return {
            **report,
            "turns_to_come": None if ahead is None else round(ahead, 2),
            "history_sessions": estimate.finished,
            **estimate.reach.summary(),
        }

    def poke(self) -> None:
        """Sweep in the background when one is due (a request came): no task outlives its sweep, so an idle
        proxy runs none; `/sessions/{id}` sweeps first when one is due (`sweep_if_due`)."""
        if self._task is None and self._due():
            self._task = asyncio.get_running_loop().create_task(self._background())

    async def sweep_if_due(self) -> None:
        if self._task is None and self._due():
            await self._guarded()

    def _due(self) -> bool:
        interval = max(0.1, min(MAX_SWEEP_S, self.holder.settings.policy.session_end_idle_s / 4))
        return time.monotonic() - self._swept_at >= interval

    async def _background(self) -> None:
        try:
            await self._guarded()
        finally:
            self._task = None

    async def _guarded(self) -> None:
        self._swept_at = time.monotonic()
        try:
            await self.sweep()
        except Exception:  # a store that fails now is tried again on the next sweep
            log.exception("session-end sweep failed")

    def _end_idle_s(self, session: Session) -> float:
        policy, _ = self.holder.settings.policy_for(visible_id(session.id))
        return policy.session_end_idle_s

    async def sweep(self) -> int:
        """Count as finished the sessions idle past `session_end_idle_s`, refresh each agent's estimate with
        the sessions still running censored at their length; the number of sessions counted finished."""
        now, finished = self.clock(), 0
        running: dict[str, list[int]] = defaultdict(list)
        for session in self.store:
            if not session.agent or session.turn_count <= session.finished_at:
                continue
            if now - session.last_seen < self._end_idle_s(session):
                running[session.agent].append(session.turn_count)
                continue
            length = session.turn_count
            recall = getattr(session.journal, "recall", None)  # what the agent's messages used, how far back
            reach = (recall.evidence, recall.older) if recall is not None else (0, 0)
            if await self.store.history.finish(session.agent, session.id, length, session.last_seen, reach):
                finished += 1
            session.finished_at = length  # counted, or another instance has it running: not counted here again
        history = self.store.history
        agents = set(running) | {agent for agent in self._estimates if history.lengths(agent)}
        await history.refresh(agents)
        self._estimates = {
            agent: Lifetimes.of(history.lengths(agent), running.get(agent, ()), history.reach(agent))
            for agent in agents
        }
        return finished
