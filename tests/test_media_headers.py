"""proxy/tokens/media.py: image sizes from their headers, PDF pages, and the APIs' documented prices."""

from __future__ import annotations

import zlib

import pytest

from proxy.tokens import media
from tests.media_files import b64, gif, jpeg, pdf, png, webp


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("png", png(1234, 567)),
        ("gif", gif(1234, 567)),
        ("jpeg", jpeg(1234, 567)),
        ("jpeg-after-a-64k-exif", jpeg(1234, 567, exif_bytes=65_000)),
        ("webp-lossy", webp(1234, 567, "VP8 ")),
        ("webp-lossless", webp(1234, 567, "VP8L")),
        ("webp-extended", webp(1234, 567, "VP8X")),
    ],
)
def test_an_images_size_is_read_from_its_header(name: str, data: bytes) -> None:
    assert media.image_size(b64(data)) == (1234, 567)


def test_a_header_is_read_without_decoding_the_rest() -> None:
    """Only the bytes the header needs are decoded: a PNG whose tail is not base64 at all still has a size."""
    assert media.image_size(b64(png(640, 480))[:40] + "!" * 100_000) == (640, 480)


def test_a_header_with_line_breaks_is_still_read() -> None:
    text = b64(jpeg(800, 600, exif_bytes=5000))
    assert media.image_size("\n".join(text[i : i + 76] for i in range(0, len(text), 76))) == (800, 600)


UNREADABLE = ["", "AAAA", "not base64 at all", b64(b"\xff\xd8\xff\xda" + bytes(64)), b64(b"GIF89a")]


@pytest.mark.parametrize("data", UNREADABLE)
def test_an_unreadable_image_is_priced_as_the_largest_the_api_bills(data: str) -> None:
    assert media.image_size(data) is None
    assert media.openai_image_tokens(None) == 1445  # 768 x 2048: 2 x 4 tiles
    assert media.anthropic_image_tokens(None) == 1600


@pytest.mark.parametrize(
    ("size", "detail", "tokens"),
    [
        ((1024, 1024), "high", 765),  # OpenAI's worked examples
        ((2048, 4096), "high", 1105),
        ((4096, 8192), "low", 85),
        ((200, 100), "auto", 255),
    ],
)
def test_openai_prices_images_by_tiles(size: tuple[int, int], detail: str, tokens: int) -> None:
    assert media.openai_image_tokens(size, detail) == tokens


@pytest.mark.parametrize(
    ("size", "tokens"),
    [((200, 200), 54), ((1092, 1092), 1590), ((1000, 1000), 1334), ((4000, 3000), 1600)],  # Anthropic's table
)
def test_anthropic_prices_images_by_pixels_after_its_resize(size: tuple[int, int], tokens: int) -> None:
    assert media.anthropic_image_tokens(size) == tokens


def test_a_pdfs_pages_are_counted_from_its_page_tree() -> None:
    assert media.pdf_pages(b64(pdf(7, 20_000))) == 7


def test_pages_kept_in_compressed_object_streams_are_counted() -> None:
    """PDF 1.5 files keep their page objects in Flate-compressed object streams, where no /Type /Page shows."""
    objects = zlib.compress(b"".join(b"<< /Type /Page /Parent 2 0 R >>\n" for _ in range(3)))
    body = b"%PDF-1.5\n1 0 obj\n<< /Type /ObjStm /N 3 /Filter /FlateDecode >>\nstream\n" + objects + b"\nendstream"
    assert media.pdf_pages(b64(body + b"\nendobj\n%%EOF\n")) == 3


def test_a_pdf_whose_pages_cannot_be_read_is_priced_by_its_size() -> None:
    data = b64(b"%PDF-1.7\n" + bytes(250_000))
    assert media.pdf_pages(data) is None
    assert media.pdf_tokens(data, 765) == 3 * (1500 + 765)  # one page a 100 KB, rounded up
    assert media.pdf_tokens(None, 1600) == 1500 + 1600  # a URL or a file id: one page


def test_parts_and_blocks_are_priced_by_their_api() -> None:
    image = "data:image/png;base64," + b64(png(1024, 1024))
    assert media.openai_part_tokens({"type": "image_url", "image_url": {"url": image}}) == 765
    assert media.openai_part_tokens({"type": "image_url", "image_url": {"url": image, "detail": "low"}}) == 85
    assert media.openai_part_tokens({"type": "input_image", "image_url": "https://example.com/a.png"}) == 1445
    assert media.openai_part_tokens({"type": "text", "text": "hi"}) == 0
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(png(200, 200))}}
    assert media.anthropic_block_tokens(block) == 54
    assert media.anthropic_block_tokens({"type": "image", "source": {"type": "url", "url": "https://x"}}) == 1600
    document = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                               "data": b64(pdf(2))}}  # fmt: skip
    assert media.anthropic_block_tokens(document) == 2 * (1500 + 1600)
