"""How many turns a session has still to come, from how long its agent's finished sessions lasted.

A Kaplan-Meier estimate: the lengths (requests) of the agent's finished sessions are events, the sessions
still running are censored at the length they have reached. For a session at its request `n`, the turns
to come are E[T - n | T >= n], summed over the estimate's steps up to the longest length observed (past
it nothing is known, so nothing is counted: the estimate errs short, the cheap side of an edit's bet).
Pure data: the service gathers the lengths (`proxy.state.lifetimes`) and hands the engine a `Lifetimes`.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.context.reach import NO_REACH, Reach

# Fewer finished sessions than this and the history says nothing: the engine keeps its rule without history.
MIN_FINISHED = 5
# A session longer than all but this many of its agent's sessions (finished or running) is past what the
# history can say: the rule without history prices its edits.
MIN_AT_RISK = 3
# An edit that costs more than it frees may bet on the turns to come that all but this share of the agent's
# sessions that reached this request outlasted (`Lifetimes.assured_turns`; `economics.within_budget`).
RISK = 0.1


@dataclass(frozen=True)
class Lifetimes:
    """One agent's session lengths, and the turns to come they predict at each request number."""

    finished: int = 0  # finished sessions the estimate rests on
    # ahead[n] = expected turns after request n for a session that reached it (None: the history cannot say).
    ahead: tuple[float | None, ...] = ()
    # assured[n]: turns after request n that all but `RISK` of the sessions reaching it outlasted (0: none known).
    assured: tuple[int, ...] = ()
    # How far back the agent's finished sessions reached for what they used (`reach.Reach`).
    reach: Reach = NO_REACH

    @classmethod
    def of(cls, finished: Iterable[int], running: Iterable[int] = (), reach: Reach = NO_REACH) -> Lifetimes:
        """The estimate from finished sessions' lengths and running sessions' lengths so far (censored)."""
        ends = [n for n in finished if n > 0]
        alive = [n for n in running if n > 0]
        if len(ends) < MIN_FINISHED:
            return cls(finished=len(ends), reach=reach)
        longest = max(ends + alive)
        deaths = Tally(ends)
        # at_risk[t]: sessions that reached request t (length >= t), finished or running.
        reached = Tally(ends) + Tally(alive)
        at_risk = [0] * (longest + 2)
        for t in range(longest, 0, -1):
            at_risk[t] = at_risk[t + 1] + reached.get(t, 0)
        # survive[t] = P(T > t), the product over event times up to t of (1 - deaths / at risk).
        survive = [1.0] * (longest + 1)
        for t in range(1, longest + 1):
            step = 1.0 - deaths.get(t, 0) / at_risk[t] if at_risk[t] else 1.0
            survive[t] = survive[t - 1] * step
        # Turns after request n, given T >= n: sum over k > n of P(T >= k) / P(T >= n) = survive[k-1] / survive[n-1].
        ahead: list[float | None] = [None] * (longest + 1)
        tail = 0.0  # sum of survive[k - 1] for k in n+1 .. longest
        for n in range(longest, 0, -1):
            base = survive[n - 1]
            if at_risk[n] >= MIN_AT_RISK and base > 0:
                ahead[n] = tail / base
            tail += survive[n - 1]
        assured = [0] * (longest + 1)
        for n in range(1, longest + 1):
            if ahead[n] is None:
                continue
            k = 0  # P(T > n + k | T >= n) = survive[n + k] / survive[n - 1]
            while n + k < longest and survive[n + k] >= (1 - RISK) * survive[n - 1]:
                k += 1
            assured[n] = k
        return cls(finished=len(ends), ahead=tuple(ahead), assured=tuple(assured), reach=reach)

    def turns_to_come(self, request: int) -> float | None:
        """Expected turns after request `request` (1 = the session's first) of a session that reached it;
        None when the history cannot say (too few finished sessions, or longer than nearly all of them)."""
        if 0 < request < len(self.ahead):
            return self.ahead[request]
        return None

    def assured_turns(self, request: int) -> int:
        """Turns after request `request` that all but `RISK` of the agent's sessions that reached it outlasted
        (0 when the history cannot say)."""
        if 0 < request < len(self.assured):
            return self.assured[request]
        return 0


NO_HISTORY = Lifetimes()
