"""The simulator's configuration and state: recorded requests, running totals and the prefix-cache billing model."""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from proxy.context.messages import message_digest
from proxy.context.tokens import REPLY_PRIMING, canonical_bytes
from proxy.tokens.counter import counter_for, encoding_for_model

DEFAULT_ANSWER = (
    "I looked at the files you showed me. The failing test comes from the timezone conversion in the "
    "database backend: the value is converted twice when USE_TZ is enabled. I will patch the adapter "
    "so it converts once, then run the test suite again to confirm the fix and check for regressions."
)


@dataclass
class SimulatorConfig:
    """How the simulated upstream behaves.

    Header overrides per request: X-Sim-Delay-Ms, X-Sim-Chunks, X-Sim-Tool-Calls; X-Sim-Recorded names
    one of `recorded_streams` to replay; X-Sim-Piece-Bytes ("1,7,13") re-cuts any body into pieces of
    those sizes, cycled, so events straddle the reader's reads as they do behind real networks.
    """

    models: dict[str, int] = field(
        default_factory=lambda: {
            "sim-32k": 32000, "gpt-4o": 128000, "gpt-4o-mini": 128000, "gpt-5": 400000,
            "claude-sim-32k": 32000, "claude-": 200000,
        }
    )  # fmt: skip
    default_window: int = 128000  # for a model no entry names (entries match exactly or as a prefix)
    chunks: int = 16  # content deltas per streamed answer
    chunk_delay_s: float = 0.0  # pause between streamed chunks
    answer: str = DEFAULT_ANSWER
    tool_calls: int = 0  # answer with this many tool calls when the request offers tools
    recorded_streams: dict[str, bytes] = field(default_factory=dict)  # name -> SSE bytes captured from a real API
    extra_headers: dict[str, str] = field(default_factory=dict)  # on every response, as a load balancer adds them
    hidden_tokens_per_message: int = 1  # chat-template framing the proxy cannot see
    hidden_tokens_per_tool: int = 8
    cache_min_tokens: int = 1024  # OpenAI: no cache hit below 1024 tokens ...
    cache_granularity: int = 128  # ... and hits in steps of 128
    cache_keys: int = 256  # API keys whose prefixes are remembered (LRU)
    cache_prefixes_per_key: int = 100_000
    cache_ttl_s: float = 0.0  # a cached prefix unused this long is dropped (Anthropic: 300); 0 = kept for good
    record_limit: int = 1000  # requests kept in `Simulator.requests`
    silence_s: float = 3600.0  # the `silence` faults: longer than any timeout
    slow_headers_s: float = 0.5
    fault_after_chunks: int = 2  # mid-stream faults strike after this many chunks
    embedding_dims: int = 16
    claude_token_ratio: float = 1.12  # Messages: Claude's tokenizer counts this many tokens per tiktoken token

    def window(self, model: str) -> int:
        if model in self.models:
            return self.models[model]
        prefixes = [name for name in self.models if model.startswith(name)]
        return self.models[max(prefixes, key=len)] if prefixes else self.default_window


@dataclass
class RecordedRequest:
    method: str
    path: str  # as sent on the wire (percent-escapes kept), with the query string
    headers: CIMultiDict[str]
    raw: bytes
    body: Any  # parsed JSON, or None


@dataclass
class SimTotals:
    """Running totals over chat completions, for savings reports."""

    requests: int = 0
    answered: int = 0
    refused: int = 0  # context_length_exceeded
    prompt_tokens: int = 0
    cached_tokens: int = 0
    written_tokens: int = 0  # Anthropic Messages: cache writes
    completion_tokens: int = 0
    disconnects: int = 0  # requests the client left before their answer ended


class Simulator:
    """The app's state: config, recorded requests, totals and the prefix cache."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.requests: deque[RecordedRequest] = deque(maxlen=config.record_limit)
        self.totals = SimTotals()
        self.active_streams = 0
        self.body_bytes = 0  # request body bytes read so far, counted as they arrive
        self._ids = itertools.count(1)
        # key -> prefix digest -> when it was last written or read (by `clock`, for `cache_ttl_s`)
        self._cache: OrderedDict[str, OrderedDict[bytes, float]] = OrderedDict()
        self.clock: Callable[[], float] = time.monotonic

    def reset(self) -> None:
        """Forget requests, totals and the prompt cache (between a direct and a proxied replay)."""
        self.requests.clear()
        self.totals = SimTotals()
        self._cache.clear()

    def next_id(self) -> int:
        return next(self._ids)

    def measure(self, model: str, tools: Any, messages: list[dict]) -> tuple[int, list[tuple[bytes, int]]]:
        """Prompt tokens as the upstream bills them, and the chain of (prefix digest, tokens so far)."""
        counter = counter_for(encoding_for_model(model))
        running = hashlib.blake2b(model.encode() + b"\0" + canonical_bytes(tools), digest_size=16)
        total = 0
        if tools:
            total = counter.count_text(json.dumps(tools)) + self.config.hidden_tokens_per_tool * len(tools)
        chain = [(running.digest(), total)]
        for message in messages:
            digest = message_digest(message)
            total += counter.count_message(message, digest) + self.config.hidden_tokens_per_message
            running.update(digest)
            chain.append((running.digest(), total))
        return total + REPLY_PRIMING, chain

    def cached_tokens(self, key: str, chain: list[tuple[bytes, int]], granularity: int | None = None) -> int:
        """The longest prefix an earlier request of this key shared, in OpenAI's cache steps (or `granularity`)."""
        seen, now, ttl = self._cache.get(key), self.clock(), self.config.cache_ttl_s
        alive = (d for d in reversed(chain) if seen and d[0] in seen and not 0 < ttl < now - seen[d[0]])
        hit = next(alive, None)  # the longest live prefix: the search stops at the first from the end
        if hit is not None and seen is not None:
            seen[hit[0]] = now  # a read keeps the prefix alive another TTL
        longest = hit[1] if hit else 0
        if longest < self.config.cache_min_tokens:
            return 0
        step = granularity or self.config.cache_granularity
        return longest // step * step

    def remember(self, key: str, chain: list[tuple[bytes, int]]) -> None:
        seen = self._cache.pop(key, None) or OrderedDict()
        self._cache[key] = seen
        now = self.clock()
        for digest, _ in chain:
            seen[digest] = now
            seen.move_to_end(digest)
        while len(seen) > self.config.cache_prefixes_per_key:
            seen.popitem(last=False)
        while len(self._cache) > self.config.cache_keys:
            self._cache.popitem(last=False)


SIMULATOR = web.AppKey("simulator", Simulator)
