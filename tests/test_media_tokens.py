"""Inline images and PDFs are counted as the APIs bill them (issue 29 #7), not as the base64 text they travel in.

A real proxy, the official SDKs as clients, an aiohttp upstream on 127.0.0.1 that records what it gets. On
1f96cd0 a 500 KB PDF on Messages counted 547,195 tokens and a 150 KB image on Responses 140,693: both were
refused by the proxy at a 32k window; chat counted its images as nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp import web

from proxy.config.loader import ConfigHolder
from proxy.context.policy import ModelInfo
from proxy.service.engine_service import build_context_service
from tests.harness import ChatUpstream, make_settings, serve_proxy
from tests.media_files import b64, pdf, png

WINDOW = 32_000
MARGIN = 1.2  # what the packaged Claude rows multiply our count by until usage teaches the ratio
PDF_PAGES = 5
PDF_B64 = b64(pdf(PDF_PAGES, 500_000))  # ~500 KB
PNG_B64 = b64(png(1600, 1000, noisy_rows=32))  # ~155 KB, 1600 x 1000
# The billed rules, worked by hand for these files:
# OpenAI, detail auto: 1600x1000 fits 2048; shortest side to 768 -> 1229x768: 3 x 2 tiles: 85 + 6 x 170.
OPENAI_PNG = 1105
# Anthropic: long edge 1600 > 1568 -> 1568x980 = 1.54 MP, past its ~1.15 MP: the largest it bills.
ANTHROPIC_PNG = 1600
# A PDF page: its text (1,500, Anthropic's documented low end) and its image (a Letter page by each rule).
OPENAI_PDF = PDF_PAGES * (1500 + 765)
ANTHROPIC_PDF = PDF_PAGES * (1500 + 1600)
TEXT_SLACK = 200  # the prompt's words, the framing and the markers


class RecordingUpstream(ChatUpstream):
    """Chat, Responses and Messages on 127.0.0.1: records each body's bytes, answers "ok"."""

    def __init__(self) -> None:
        super().__init__(64 * 1024 * 1024, paths=("/v1/chat/completions", "/v1/responses", "/v1/messages"))
        self.bodies: list[bytes] = []

    async def answer(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.bodies.append(raw)
        model = orjson.loads(raw)["model"]
        if request.path.endswith("/messages"):
            return web.json_response({
                "id": "msg_1", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 100, "output_tokens": 1},
            })  # fmt: skip
        if request.path.endswith("/responses"):
            message = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": "ok", "annotations": []}]}  # fmt: skip
            return web.json_response({
                "id": "resp_1", "object": "response", "created_at": 0, "status": "completed", "model": model,
                "output": [message], "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                "usage": {"input_tokens": 100, "output_tokens": 1, "total_tokens": 101,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}},
            })  # fmt: skip
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101},
        })  # fmt: skip


@pytest.fixture
async def proxy() -> Any:
    """(proxy root URL, upstream): models `gpt-small` and `claude-small` with a 32k window."""
    upstream = RecordingUpstream()
    url = await upstream.start()
    settings = make_settings(url, server={"max_body_mb": 64})
    models = (
        ModelInfo(pattern="gpt-small*", context_window=WINDOW, input_per_mtok=2.5, cached_input_per_mtok=1.25),
        ModelInfo(pattern="claude-small*", context_window=WINDOW, input_per_mtok=3.0, cached_input_per_mtok=0.3,
                  cache_write_per_mtok=3.75, estimate_margin=MARGIN, marked_cache=True),
    )  # fmt: skip
    holder = ConfigHolder(replace(settings, models=models))
    context = build_context_service(holder)
    runner, port = await serve_proxy(holder, context)
    yield f"http://127.0.0.1:{port}", upstream
    await runner.cleanup()
    context.store.close()
    await upstream.runner.cleanup()


async def session(root: str, name: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{root}/sessions/{name}") as response:
        assert response.status == 200
        return await response.json()


async def test_a_pdf_and_an_image_on_messages_go_through_a_small_window_counted_by_pages_and_pixels(proxy: Any) -> None:
    root, upstream = proxy
    client = anthropic.AsyncAnthropic(base_url=f"{root}/s/media-messages", api_key="k", max_retries=0)
    content = [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_B64}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}},
        {"type": "text", "text": "What does the report say about the chart?"},
    ]
    answer = await client.messages.create(
        model="claude-small", max_tokens=1024, messages=[{"role": "user", "content": content}]
    )
    assert answer.content[0].text == "ok"  # not the proxy's "prompt is too long"
    sent = upstream.bodies[-1]
    assert PDF_B64.encode() in sent and PNG_B64.encode() in sent  # the files' bytes go as the client sent them
    billed = ANTHROPIC_PDF + ANTHROPIC_PNG
    counted = (await session(root, "media-messages"))["tokens_before"]
    assert billed <= counted <= billed * MARGIN + TEXT_SLACK, counted


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_a_pdf_and_an_image_on_openai_go_through_a_small_window_counted_by_tiles_and_pages(
    proxy: Any, api: str
) -> None:
    root, upstream = proxy
    client = openai.AsyncOpenAI(base_url=f"{root}/s/media-{api}/v1", api_key="k", max_retries=0)
    image_url = f"data:image/png;base64,{PNG_B64}"
    file_data = f"data:application/pdf;base64,{PDF_B64}"
    if api == "responses":
        content: list[Any] = [
            {"type": "input_text", "text": "What does the report say about the chart?"},
            {"type": "input_image", "image_url": image_url, "detail": "auto"},
            {"type": "input_file", "filename": "report.pdf", "file_data": file_data},
        ]
        answer = await client.responses.create(model="gpt-small", input=[{"role": "user", "content": content}])
        assert answer.output_text == "ok"
    else:
        content = [
            {"type": "text", "text": "What does the report say about the chart?"},
            {"type": "image_url", "image_url": {"url": image_url, "detail": "auto"}},
            {"type": "file", "file": {"filename": "report.pdf", "file_data": file_data}},
        ]
        chat = await client.chat.completions.create(model="gpt-small", messages=[{"role": "user", "content": content}])
        assert chat.choices[0].message.content == "ok"
    sent = upstream.bodies[-1]
    assert PDF_B64.encode() in sent and PNG_B64.encode() in sent
    billed = OPENAI_PDF + OPENAI_PNG
    counted = (await session(root, f"media-{api}"))["tokens_before"]
    assert billed <= counted <= billed + TEXT_SLACK, counted


async def test_screenshots_in_tool_results_are_cleared_and_leave_the_count(proxy: Any) -> None:
    """An agent that screenshots every step: 24 x 1,600 tokens of images do not fit 32k, so the older results
    are cleared, their images go with them, and what is counted after is what is still sent."""
    root, upstream = proxy
    shots = [b64(png(1600, 1000, noisy_rows=1, seed=n)) for n in range(24)]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Click through the settings and report."}]
    for n, shot in enumerate(shots):
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{n}", "name": "screenshot", "input": {"step": n}}]})  # fmt: skip
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": [
            {"type": "text", "text": f"Screen after step {n}."},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": shot}}]}]})  # fmt: skip
    client = anthropic.AsyncAnthropic(base_url=f"{root}/s/media-shots", api_key="k", max_retries=0)
    answer = await client.messages.create(model="claude-small", max_tokens=1024, messages=messages)  # type: ignore[arg-type]
    assert answer.content[0].text == "ok"
    sent = orjson.loads(upstream.bodies[-1])["messages"]
    results = [b for m in sent if isinstance(m["content"], list) for b in m["content"] if b["type"] == "tool_result"]
    assert len(results) == len(shots)  # every call keeps its result: cleared, not dropped
    kept = [r for r in results if isinstance(r["content"], list) and r["content"][-1]["type"] == "image"]
    assert 0 < len(kept) < len(shots)
    assert [r["content"][-1]["source"]["data"] for r in kept] == shots[-len(kept) :]  # the newest, as sent
    report = await session(root, "media-shots")
    assert report["tokens_before"] >= len(shots) * ANTHROPIC_PNG
    assert report["tokens_after"] <= WINDOW - 1024
    assert len(kept) * ANTHROPIC_PNG <= report["tokens_after"] <= len(kept) * ANTHROPIC_PNG * MARGIN + 2000
