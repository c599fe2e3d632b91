"""A session's policy: the knobs of the context engine, as plain frozen data.

`proxy.config.loader` builds these from TOML (defaults, then a session file's overrides);
the engine only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.context.patterns import pattern_problem
from proxy.context.window import TruncationStrategy

# The seed's strategies, and `error`: answer 400 instead of removing anything.
TRUNCATIONS = (*(strategy.value for strategy in TruncationStrategy), "error")

DEFAULT_ERROR_PATTERNS = (r"^\s*Error", r"^\s*error:", r"^\s*Traceback")

# `default`: every edit that pays; `lossless`: only edits that leave what they remove standing elsewhere in
# the request (dedup, compaction), unless the window (or the operator's soft budget) forces more.
MODES = ("default", "lossless")


@dataclass(frozen=True)
class ClearPolicy:
    enabled: bool = True
    # Measured on the packaged traces (tests/context/replay.py): smaller is cheaper at every cache
    # discount; the pipeline never clears outputs among the last six messages, whatever these say.
    # 1000 (was 2000) once outputs in use are spared: as cheap, and loses less (bench/quality.py).
    keep_tokens: int = 1000
    keep_under: int = 100
    clear_at_least: int = 1000
    errors_keep_under: int | None = 1000
    exclude_tools: tuple[str, ...] = ()
    error_patterns: tuple[str, ...] = DEFAULT_ERROR_PATTERNS
    # Regexes that mark *user* messages as tool output (text-mode agents).
    observation_patterns: tuple[str, ...] = ()
    # Outputs holding a name, path or number the agent quoted in its last `in_use_turns` messages stay,
    # the newest first, up to `in_use_tokens` of them (either 0 = off).
    in_use_turns: int = 6
    in_use_tokens: int = 8000
    # After a turn whose agent message used what only cleared output held (a recall miss), `keep_tokens`
    # doubles, up to this; the doubling fades by `recall.MISS_FADE` a turn (<= keep_tokens: off). 2500, not
    # more: 3000 and 8000 lost no less on bench quality's samples and bill Responses' packaged traces over 0.78.
    miss_keep_tokens: int = 2500
    # A cleared output keeps, in a stub of at most this many tokens, the lines holding what the agent wrote
    # after reading it (`proxy.context.stubs`); 0: the placeholder alone.
    stub_tokens: int = 0
    # The same in an epoch the window (or the soft budget) forces, the larger of the two, counting all the agent
    # wrote (truncation drops its older messages there). 600: packaged 32k turns losing 3+ 3.6% -> 2.1%, billed
    # no more; 128k (no forced epoch) unchanged; 300 and 1200 measured the same (bench/quality.py).
    forced_stub_tokens: int = 600


@dataclass(frozen=True)
class CapsulePolicy:
    budget_tokens: int = 1500
    min_score: float = 0.0
    max_capsules: int = 0
    tags: tuple[str, ...] = ()
    prefer_roles: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()


@dataclass(frozen=True)
class Policy:
    name: str = "default"
    mode: str = "default"
    reserve_output_tokens: int = 4096
    truncation: str = "truncate_left"
    high_water: float = 0.90
    low_water: float = 0.60
    dedup: bool = True
    # A tool output's lines that stand word for word in an earlier output still sent point at where they stand,
    # from the turn after it arrived, when that pays (`proxy.context.steps.compact`).
    compact: bool = True
    pin_first_user: bool = True
    max_message_share: float = 0.125
    # In an epoch, the agent's messages it re-bills anyway (after its first change), but the last
    # `agent_messages_kept`, keep the head and tail of their text within this many tokens (0 = off;
    # `steps/agent_messages.py`). 500 and 6: `bench quality` d = 1 packaged 0.743 -> 0.636 of direct, turns
    # losing 3+ of what the next message used from outputs or the agent's own messages 2.1% -> 2.9% (300: 3.6%).
    agent_message_tokens: int = 500
    agent_messages_kept: int = 6
    # Opt-in: keep the context near this many tokens (0 = off), for uncached models.
    soft_budget_tokens: int = 0
    # Turns' input a session's first edit that costs more than it frees may risk, beyond what it wins back
    # on the next turn (`economics.within_budget`). 0: edits never bill a session above sending its
    # requests as they were, unless it ends on an edit's turn (then by at most 0.02 of it). 1 saves more with
    # cheap caching (d = 0.1: 0.91 of direct, not 0.99, on 31 traces) but billed 3 of them up to 1.011 of direct
    # (`bench epoch-rule`).
    first_edit_risk_turns: float = 0.0
    # A costly edit may bet on the turns nearly every finished session of its agent outlasted
    # (`survival.assured_turns`) only while the session, were it to end on the edit's turn, stays within this
    # share of its direct bill so far (`economics.within_budget`; a bet on the next turn alone, history or not,
    # within `economics.NEXT_TURN_BEHIND`, 0.02). 0.1: `bench fleet` d = 0.1 0.895 of direct tuned, 0.861 held
    # out, no run above 1.010 (0.02: 0.954 / 0.898; 0.05: 0.937 / 0.888; 0.2: 0.888 / 0.873, 1.010), once an
    # epoch's re-billed tail stops where the turn's new messages start (BENCHMARKS.md, "An epoch priced by what
    # the cache held"); by construction a session that stops on a bet's turn may end this share above direct.
    bet_overrun: float = 0.1
    # A session with no request for this long counts as finished: its length joins its agent's history, by
    # which later sessions' edits are priced (`survival`). 1800: an agent's requests come seconds to minutes
    # apart (a long test run, a person reading a reply); after half an hour the prompt cache is cold anyway
    # (Anthropic 5 min, OpenAI 5-10 min, at most 1 h), so a session resumed later starts a new bill, and it is
    # well inside `[state] idle_ttl_s` (6 h: the session is still held when it counts as finished).
    session_end_idle_s: float = 1800.0
    clear_tool_outputs: ClearPolicy = field(default_factory=ClearPolicy)
    capsules: CapsulePolicy = field(default_factory=CapsulePolicy)

    @property
    def lossless(self) -> bool:
        """Nothing is removed that does not still stand elsewhere in the request, unless the window forces it."""
        return self.mode == "lossless"


@dataclass(frozen=True)
class ModelInfo:
    """One row of the model table: window, tokenizer and prices (USD per million tokens)."""

    pattern: str = "*"
    context_window: int = 128000
    encoding: str = "o200k_base"
    input_per_mtok: float = 1.0
    cached_input_per_mtok: float = 0.5
    output_per_mtok: float = 4.0
    # What writing a token to the prompt cache costs (Anthropic bills it; None = the input price).
    cache_write_per_mtok: float | None = None
    # Our token count times this until the upstream's usage taught the real ratio (no tokenizer for this model).
    estimate_margin: float = 1.0
    # The upstream reads a cached prefix only where the last request marked one (Anthropic's breakpoints; the
    # proxy marks the end of the prefix before the oldest long output still sent), not at any prefix (OpenAI).
    marked_cache: bool = False
    # Seconds after its last use by which the upstream has surely dropped a cached prefix (Anthropic: 300;
    # OpenAI: 3600, "5-10 minutes, up to an hour"); a session idle longer is re-written in full anyway, so
    # that turn any edit pays. A request may ask for longer (`Conversation.cache_ttl_s`). 0: never assumed.
    cache_ttl_s: int = 0
    # The upstream refuses a request whose max_tokens does not fit in the window beside the prompt (OpenAI, Claude
    # before 4.5), so all of it is kept free. False: the reply stops at the window instead (Claude from 4.5 on,
    # stop reason `model_context_window_exceeded`; Claude Code asks for 128k), so the prompt may use the window
    # but `Policy.reserve_output_tokens` of it, or max_tokens when that is less.
    max_tokens_in_window: bool = True

    @property
    def write_price(self) -> float:
        return self.input_per_mtok if self.cache_write_per_mtok is None else self.cache_write_per_mtok

    @property
    def write_factor(self) -> float:
        """w: the cache write price as a share of the input price (1.0 where writes cost nothing extra)."""
        return self.write_price / self.input_per_mtok if self.input_per_mtok > 0 else 1.0

    @property
    def cache_discount(self) -> float:
        """d: the cached price as a share of the input price (1.0 = no caching)."""
        if self.input_per_mtok <= 0:
            return 1.0
        return min(1.0, max(0.0, self.cached_input_per_mtok / self.input_per_mtok))


def policy_from_dict(data: dict[str, Any], name: str = "default") -> Policy:
    """Build a Policy from a TOML-shaped dict; a missing key takes the default."""
    data = dict(data)
    clear = dict(data.pop("clear_tool_outputs", {}) or {})
    capsules = dict(data.pop("capsules", {}) or {})
    for key in ("exclude_tools", "error_patterns", "observation_patterns"):
        if key in clear:
            clear[key] = tuple(clear[key])
    for key in ("tags", "prefer_roles", "kinds"):
        if key in capsules:
            capsules[key] = tuple(capsules[key])
    data.setdefault("name", name)
    policy = Policy(**data, clear_tool_outputs=ClearPolicy(**clear), capsules=CapsulePolicy(**capsules))
    if policy.mode not in MODES:
        raise ValueError(f"policy.mode must be one of {', '.join(MODES)}, not {policy.mode!r}")
    if policy.truncation not in TRUNCATIONS:
        raise ValueError(f"policy.truncation must be one of {', '.join(TRUNCATIONS)}, not {policy.truncation!r}")
    if not 0 < policy.low_water <= policy.high_water <= 1:
        raise ValueError("policy needs 0 < low_water <= high_water <= 1")
    for key in ("observation_patterns", "error_patterns"):  # refused at load, never a slow search per request
        if problem := pattern_problem(getattr(policy.clear_tool_outputs, key)):
            raise ValueError(f"clear_tool_outputs.{key}: {problem}")
    return policy
