"""The one token counter: offline encodings, model mapping, framing, bounded cache."""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import random

import pytest

from proxy.context.pipeline import tools_tokens
from proxy.tokens import encodings
from proxy.tokens.counter import TokenCounter, counter_for, encoding_for_model
from proxy.tokens.encodings import EncodingUnavailable, get_encoding


def test_both_encodings_load_offline_and_tokenize_like_tiktoken() -> None:
    assert get_encoding("o200k_base").encode("hello world") == [24912, 2375]
    assert get_encoding("cl100k_base").encode("hello world") == [15339, 1917]


def test_packaged_files_have_the_sha256_tiktoken_expects() -> None:
    expected = {
        "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    }
    for name, digest in expected.items():
        package, resource, compressed = encodings.PACKAGED_FILES[name]
        data = importlib.resources.files(package).joinpath(resource).read_bytes()
        assert hashlib.sha256(gzip.decompress(data) if compressed else data).hexdigest() == digest


def test_a_corrupt_packaged_file_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encodings, "_read_packaged", lambda name: b"AAAA 0\n")
    monkeypatch.setattr(encodings, "_cache", {})
    with pytest.raises(EncodingUnavailable, match="sha256"):
        get_encoding("o200k_base")


def test_an_unknown_encoding_is_a_clear_error_not_a_download() -> None:
    with pytest.raises(EncodingUnavailable, match="unknown encoding 'p50k_base'"):
        get_encoding("p50k_base")


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o-2024-08-06", "o200k_base"),
        ("gpt-4.1-mini", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("llama-3-70b", "o200k_base"),
    ],
)
def test_encoding_is_chosen_by_model(model: str, encoding: str) -> None:
    assert encoding_for_model(model) == encoding


def test_unknown_models_take_the_configured_default() -> None:
    assert encoding_for_model("mistral-large", default="cl100k_base") == "cl100k_base"


def test_messages_count_openai_framing() -> None:
    counter = counter_for("cl100k_base")
    message = {"role": "user", "content": "hello world"}
    # 3 framing + role + content, and 3 to prime the reply
    assert counter.count_message(message) == counter.count_text("user\nhello world") + 3
    named = {**message, "name": "bob"}
    assert counter.count_message(named) > counter.count_message(message)


def test_tool_calls_and_tools_schema_are_counted() -> None:
    counter = counter_for("o200k_base")
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd":"ls -la"}'}}],
    }
    assert counter.count_message(call) > counter.count_message({"role": "assistant", "content": None})
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    assert tools_tokens(tools, counter) > 0
    assert tools_tokens(None, counter) == 0


def test_the_message_cache_is_bounded() -> None:
    counter = TokenCounter("o200k_base", cache_size=10)
    for i in range(50):
        counter.count_message({"role": "user", "content": f"message {i}"})
    assert len(counter._cache) == 10


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_a_text_long_enough_to_be_counted_in_slices_counts_as_the_whole(name: str) -> None:
    """Past 256 KB a text is encoded a slice at a time (so no one call holds the GIL for long): same count,
    whatever stands where a slice could end (runs of spaces and newlines, digits, marks, other scripts)."""
    pieces = ["word", " word", " " * 37, "\n\n\n", "\t", " 123456", "'s", " İ", "中文", "🙂", "e\u0301", "!?", " Σ"]
    text = "".join(random.Random(0).choices(pieces, k=300_000))  # a cut at any whitespace: 5 tokens off
    assert len(text) > 5 * 256 * 1024  # cut four times or more
    assert counter_for(name).count_text(text) == len(get_encoding(name).encode_ordinary(text))
