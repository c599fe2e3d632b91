"""The project's one token counter: tiktoken by model, OpenAI's framing, cached per message."""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from typing import Any

import tiktoken

from proxy.context.messages import message_digest
from proxy.context.tokens import framing, message_text, stated_tokens
from proxy.tokens.encodings import get_encoding
from proxy.tokens.media import openai_content_tokens

# Model name prefixes whose tokenizer is known; anything else takes the configured default.
# Texts at least this long are cached by digest; shorter ones are cheaper to encode again.
_CACHE_TEXT_FROM = 64
# Texts longer than this are encoded a slice at a time: one encode_ordinary call builds its whole token list
# holding the GIL (~1 s for a 20 MB capsule, which held the event loop while an engine thread counted it:
# issue 29 item 13). Each cut is a single space between a non-space and a letter, where every tiktoken
# encoding starts a new piece (" word"), so the slices' counts add up to the whole text's exactly.
_SLICE = 256 * 1024
_CUT = re.compile(r"(?<=\S) (?=[A-Za-z])")

_CL100K_PREFIXES = ("gpt-4-", "gpt-4", "gpt-3.5", "text-embedding-3", "text-embedding-ada")
_O200K_PREFIXES = ("gpt-4o", "chatgpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "ft:gpt-4o")


def encoding_for_model(model: str, default: str = "o200k_base") -> str:
    """`o200k_base` for gpt-4o/4.1/5 and o-series, `cl100k_base` for gpt-4/3.5, else `default`."""
    name = model.lower()
    if name.startswith(_O200K_PREFIXES):
        return "o200k_base"
    if name.startswith(_CL100K_PREFIXES):
        return "cl100k_base"
    return default


class TokenCounter:
    """Counts text and chat messages with one tiktoken encoding.

    Message counts are cached by a digest of the message, so a warm turn only
    encodes what is new; the cache is a bounded LRU.
    """

    def __init__(self, encoding: str | tiktoken.Encoding, cache_size: int = 200_000) -> None:
        self.encoding = get_encoding(encoding) if isinstance(encoding, str) else encoding
        self.cache_size = cache_size
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()  # the engine may count on its worker thread and on the event loop

    @property
    def name(self) -> str:
        return self.encoding.name

    def count_text(self, text: str) -> int:
        """Tokens of `text`; long texts are cached by digest, since encoding costs far more than hashing."""
        if len(text) < _CACHE_TEXT_FROM:
            return len(self.encoding.encode_ordinary(text))
        key = b"t" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:16]
        cached = self._recall(key)
        if cached is not None:
            return cached
        count = self._encoded_length(text)
        self._remember(key, count)
        return count

    def _encoded_length(self, text: str) -> int:
        total, start = 0, 0
        while start < len(text):
            cut = _CUT.search(text, start + _SLICE) if len(text) - start > _SLICE else None
            end = cut.start() if cut else len(text)
            total += len(self.encoding.encode_ordinary(text[start:end]))
            start = end
        return total

    def _recall(self, key: bytes) -> int | None:
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
            return cached

    def _remember(self, key: bytes, count: int) -> None:
        with self._lock:
            self._cache[key] = count
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def count_message(self, message: dict[str, Any], digest: bytes | None = None) -> int:
        key = digest if digest is not None else message_digest(message)
        cached = self._recall(key)
        if cached is not None:
            return cached
        # A chat message's images and files (its own `image_url` and `file` parts) as OpenAI bills them; the
        # other dialects state theirs (`stated_tokens`).
        media = openai_content_tokens(message.get("content"))
        count = self.count_text(message_text(message)) + framing(message) + stated_tokens(message) + media
        self._remember(key, count)
        return count


_counters: dict[str, TokenCounter] = {}


def counter_for(encoding: str) -> TokenCounter:
    """One shared counter per encoding, so the per-message cache is shared across sessions."""
    counter = _counters.get(encoding)
    if counter is None:
        counter = _counters[encoding] = TokenCounter(encoding)
    return counter
