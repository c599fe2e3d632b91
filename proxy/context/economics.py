"""When an edit pays, under a prefix-cache price model (SPEC §3, "When an epoch pays").

Upstreams bill the longest prompt prefix they have seen before at `d` times the input
price (d = cached price / input price; 1.0 = no caching). Editing a message at token
position p re-bills everything after it at full price once, and makes every later
request F tokens shorter. The same model, run over whole traces, is how the policy's
defaults were measured (`bill`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from proxy.context.policy import ModelInfo, Policy
from proxy.context.survival import NO_HISTORY, Lifetimes

# Turns still to come, as a share of the turns so far, for an agent with no history (SPEC §3's 0.5). 1.0 billed
# least while an epoch's cost counted the turn's new messages as re-billed (until b31a9c6): a longer horizon made
# up for a cost priced too high. Priced right, 0.5 bills less at d = 0.1 and 0.5 on every tuned set, on the real
# Codex CLI (200k: 0.871 -> 0.768) and `bench idle` (a pause every 20 turns: 1.015 -> 0.947); 0.25 is mixed
# (`python -m bench epoch-rule`; BENCHMARKS.md, "Turns to come, priced right").
TURNS_TO_COME = 0.5
# The share of what a session's edits have saved that one edit costing more than it frees may stake:
# whatever its bets do, a session keeps at least the rest. 1.0 let the savings of free edits at an
# expired cache fund bets that lost more (`bench idle`: 1.076 of direct; 0.872 at 0.5, 0.25 no better).
STAKE = 0.5
# Beyond that stake, an edit may cost what it wins back on this many turns after it. 1: unless the
# session ends on the very turn of the edit, its edits never bill it above no edits at all; if it does, by at
# most `Policy.bet_overrun` of its direct bill so far. The first edit's allowance was one turn's whole bill
# until 24 sampled runs showed 3 ending before it was repaid (1.006-1.011 of direct at d = 0.1); 2 to 8 turns
# bill some trace above direct too (`bench epoch-rule`).
REPAY_TURNS = 1.0
# How far a bet on the next turn alone may leave a session behind its direct bill so far, were it to end on the
# edit's turn: issue 27's "no session above 1.02 of direct", for an agent with no history too.
NEXT_TURN_BEHIND = 0.02
# The shipped cap on a costly edit's bet (`Policy.bet_overrun`, where it is explained).
BEHIND = Policy.bet_overrun

# One block of a request as the cache sees it: its exact bytes and its tokens.
Block = tuple[bytes, int]


@dataclass(frozen=True)
class Bill:
    """Input tokens of a run of requests, split into those billed in full and those read from the cache."""

    uncached: int = 0
    cached: int = 0
    discount: float = 1.0

    @property
    def billed(self) -> float:
        """Input tokens at the full price that would cost the same: uncached + d × cached."""
        return self.uncached + self.discount * self.cached

    @property
    def total(self) -> int:
        return self.uncached + self.cached


def input_cost_usd(model: ModelInfo, prompt: int, cached: int = 0, written: int = 0) -> float:
    """The input cost of one request: cache reads at the cached price, writes at the write price, the rest in full."""
    cached = max(0, min(cached, prompt))
    written = max(0, min(written, prompt - cached))
    full = prompt - cached - written
    return (full * model.input_per_mtok + cached * model.cached_input_per_mtok + written * model.write_price) / 1e6


def expected_turns_to_come(turns_so_far: int, lifetimes: Lifetimes = NO_HISTORY) -> float:
    """Turns after this one, for a session whose request holds `turns_so_far` replies: what its agent's finished
    sessions predict for one that lasted this long (`survival.Lifetimes`), else `TURNS_TO_COME` × the turns so far."""
    predicted = lifetimes.turns_to_come(turns_so_far + 1)
    return TURNS_TO_COME * max(0, turns_so_far) if predicted is None else predicted


def epoch_cost(discount: float, tokens_after: int, first_changed: int, freed: int, write: float = 1.0) -> float:
    """Extra billed tokens this turn: the rewritten tail at the write price `write` (Anthropic: 1.25, 2 for 1 h;
    else 1, the input price) instead of the cached one, less the freed tokens' cached price: (w - d)(L - p) - dF.

    `tokens_after` (L) is where what the cache held ends once edited: the turn's new messages are billed in full
    with or without the edit (SPEC §3 takes L as the whole prompt, which prices every epoch (w - d) x the turn's
    new tokens too high; `steps/clear.py` passes the end of the cached part, but for a marked cache)."""
    return (write - discount) * max(0, tokens_after - first_changed) - discount * freed


def epoch_saving(discount: float, freed: int, turns_to_come: float) -> float:
    """Billed tokens saved on the turns to come, each reading `freed` fewer tokens from the cache."""
    return discount * freed * turns_to_come


def epoch_value(
    *,
    discount: float,
    tokens_after: int,
    first_changed: int,
    freed: int,
    turns_so_far: int,
    write: float = 1.0,
    lifetimes: Lifetimes = NO_HISTORY,
) -> float:
    """Billed tokens an edit freeing `freed` tokens from token position `first_changed` on is expected to
    save, net of its cache miss (negative: it costs more than it saves)."""
    if freed <= 0:
        return 0.0
    cost = epoch_cost(discount, tokens_after, first_changed, freed, write)
    return epoch_saving(discount, freed, expected_turns_to_come(turns_so_far, lifetimes)) - cost


def epoch_pays(
    *, discount: float, tokens_after: int, first_changed: int, freed: int, turns_so_far: int, write: float = 1.0
) -> bool:
    """Whether an edit freeing `freed` tokens from token position `first_changed` on is worth its cache miss.

    With d = 1 (no caching) any edit that frees tokens pays at once.
    """
    value = epoch_value(
        discount=discount, tokens_after=tokens_after, first_changed=first_changed, freed=freed,
        turns_so_far=turns_so_far, write=write,
    )  # fmt: skip
    return value > 0


def billed_input(discount: float, write: float, cached: float, uncached: float) -> float:
    """One request's input in full-price tokens: the cached prefix at d, the rest at the write price w."""
    return discount * cached + write * uncached


def within_budget(
    cost: float,
    banked: float,
    per_turn: float,
    first_turn: float = 0.0,
    risk_turns: float = 0.0,
    assured_turns: float = 0.0,
    direct: float = 0.0,
    behind: float = BEHIND,
) -> bool:
    """Whether an edit costing `cost` billed tokens this turn may be made, with `banked` saved so far,
    `per_turn` the billed tokens it saves on each turn after this one (`epoch_saving` of one turn), and
    `first_turn` this request's bill as the client wrote it when the edit is the session's first (else 0),
    of which it may bet `risk_turns` (`Policy.first_edit_risk_turns`).

    An edit that frees more than its rewrite costs is always made, and so is one within `STAKE` of the
    savings the session's edits have banked (it stays ahead whatever comes). Beyond that it bets on the
    session going on: it may cost what it wins back by the `REPAY_TURNS` turns after it, or, where the agent's
    history says all but `survival.RISK` of its sessions that lasted this long went on for `assured_turns`
    more, by then; either way only while the session, were it to end on this turn, would be at most so much of
    `direct` (the client's requests' bill so far, this one's included) above it: `NEXT_TURN_BEHIND` for a bet
    on the next turn, `behind` (`Policy.bet_overrun`) for one on the history's turns (the lesser of the two
    for both, when `behind` is the lesser).
    `risk_turns` of the first turn's bill (with the next turn's saving) is the operator's own bet, not capped.
    """
    risk = risk_turns * first_turn if first_turn > 0 else 0.0
    stake = STAKE * max(0.0, banked)
    if cost <= stake or (risk > 0 and cost <= stake + risk + REPAY_TURNS * per_turn):
        return True
    # Were the session to end on this turn, it would bill `cost - banked` above direct: a bet on the next turn
    # alone may leave it `NEXT_TURN_BEHIND` of its direct bill so far behind, one on the turns the history assures
    # `behind`.
    if cost <= stake + REPAY_TURNS * per_turn and cost <= banked + min(behind, NEXT_TURN_BEHIND) * direct:
        return True
    return cost <= stake + assured_turns * per_turn and cost <= banked + behind * direct


def cached_prefix(previous: Sequence[Block], current: Sequence[Block]) -> int:
    """Tokens of the longest run of leading blocks `current` shares, byte for byte, with `previous`."""
    tokens = 0
    for before, now in zip(previous, current, strict=False):
        if before[0] != now[0]:
            break
        tokens += now[1]
    return tokens


def bill(requests: Iterable[Sequence[Block]], discount: float) -> Bill:
    """The input bill of a session's requests in order, each cached against the one before it."""
    uncached = cached = 0
    previous: Sequence[Block] = ()
    for request in requests:
        hit = cached_prefix(previous, request)
        cached += hit
        uncached += sum(tokens for _, tokens in request) - hit
        previous = request
    return Bill(uncached, cached, discount)
