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

from proxy.context.policy import ModelInfo

# Turns still to come, as a share of the turns so far (a prototype measured 0.25/0.5/1: 0.5 was best).
TURNS_TO_COME = 0.5

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


def expected_turns_to_come(turns_so_far: int) -> float:
    return TURNS_TO_COME * max(0, turns_so_far)


def epoch_cost(discount: float, tokens_after: int, first_changed: int, freed: int, write: float = 1.0) -> float:
    """Extra billed tokens this turn: the rewritten tail at the write price `write` (Anthropic: 1.25, 2 for 1 h;
    else 1, the input price) instead of the cached one, less the freed tokens' cached price: (w - d)(L - p) - dF."""
    return (write - discount) * max(0, tokens_after - first_changed) - discount * freed


def epoch_saving(discount: float, freed: int, turns_to_come: float) -> float:
    """Billed tokens saved on the turns to come, each reading `freed` fewer tokens from the cache."""
    return discount * freed * turns_to_come


def epoch_pays(
    *, discount: float, tokens_after: int, first_changed: int, freed: int, turns_so_far: int, write: float = 1.0
) -> bool:
    """Whether an edit freeing `freed` tokens from token position `first_changed` on is worth its cache miss.

    With d = 1 (no caching) any edit that frees tokens pays at once.
    """
    if freed <= 0:
        return False
    cost = epoch_cost(discount, tokens_after, first_changed, freed, write)
    return epoch_saving(discount, freed, expected_turns_to_come(turns_so_far)) > cost


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
