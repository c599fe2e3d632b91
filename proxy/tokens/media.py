"""Inline images and PDFs priced as the APIs bill them, not as the base64 text they travel in.

Pure: a base64 string in, a token count out; no I/O. An image's size is read from its header (PNG, JPEG,
GIF, WebP), decoding only the bytes the header needs; a PDF's page count from its objects. What cannot
be read gets a fixed estimate, never an error: the upstream judges the file, the proxy only sizes it.

The rules (each API's documentation):
- OpenAI (chat, Responses): `detail: "low"` 85 tokens; `high`/`auto`: the image fit in 2048x2048, then
  its shortest side brought down to 768, 170 per 512 px tile plus 85.
- Anthropic: width x height / 750 after its resize (long edge at most 1568 px, about 1.15 MP: 1,600 tokens).
- A PDF page, on either: its text plus an image of the page. Anthropic documents 1,500-3,000 text tokens a
  page; the low end is used, so the proxy refuses a PDF locally only when the documented minimum would not
  fit (an estimate under the upstream's count is re-fitted from its refusal; one over it cannot be).
"""

from __future__ import annotations

import binascii
import hashlib
import math
import re
import struct
import threading
import zlib
from collections import OrderedDict
from typing import Any

Size = tuple[int, int]

OPENAI_LOW_DETAIL = 85
OPENAI_TILE, OPENAI_BASE = 170, 85
OPENAI_FIT, OPENAI_SHORT_SIDE, OPENAI_TILE_PX = 2048, 768, 512
ANTHROPIC_LONG_EDGE, ANTHROPIC_MAX_IMAGE, ANTHROPIC_PIXELS_PER_TOKEN = 1568, 1600, 750
PDF_TEXT_PER_PAGE = 1500  # Anthropic's documented low end of a page's text tokens; OpenAI documents none
PAGE_PIXELS = (1700, 2200)  # a US Letter page rendered at 200 dpi: what each API's image rule prices a page as
PDF_BYTES_PER_PAGE = 100_000  # a PDF whose pages cannot be counted: one page per 100 KB of file, at least one
JPEG_MAX_SEGMENTS = 256  # a JPEG header walked this far without a frame header is unreadable
OBJECT_STREAM_MAX = 64 * 1024 * 1024  # at most this much inflated while looking for compressed page objects
PAGES_REMEMBERED = 4096  # page counts kept by digest (a few dozen bytes each)

_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")
_PAGES_COUNT = re.compile(rb"/Type\s*/Pages(?![A-Za-z])")
_COUNT = re.compile(rb"/Count\s+(\d+)")
_LINEARIZED = re.compile(rb"/Linearized\b[^>]{0,200}?/N\s+(\d+)")
_OBJECT_STREAM = re.compile(rb"/Type\s*/ObjStm\b[^>]*>>\s*stream\r?\n")
_pages: OrderedDict[bytes, int | None] = OrderedDict()
_pages_lock = threading.Lock()  # counted on the engine's threads and on the event loop
_JPEG_FRAMES = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def data_url(url: Any) -> tuple[str, str] | None:
    """(media type, base64 payload) of a `data:<type>;base64,<payload>` URL; None for any other URL."""
    if not isinstance(url, str) or not url.startswith("data:"):
        return None
    head, comma, payload = url.partition(",")
    if not comma or not head.endswith(";base64"):
        return None
    return head[5:].split(";", 1)[0].lower(), payload


class Base64Bytes:
    """Random access into the bytes a base64 string holds, decoding only the 4-character groups asked for."""

    def __init__(self, data: str) -> None:
        self.data = data
        self._whole: bytes | None = None

    def read(self, start: int, n: int) -> bytes:
        """Bytes [start, start + n) (fewer at the end)."""
        if self._whole is not None:
            return self._whole[start : start + n]
        first, last = start // 3, -(-(start + n) // 3)
        try:
            chunk = binascii.a2b_base64(self.data[first * 4 : last * 4], strict_mode=True)
        except (binascii.Error, ValueError):  # whitespace or line breaks in it: positions shift, decode it all
            return self.whole()[start : start + n]
        return chunk[start - first * 3 : start - first * 3 + n]

    def whole(self) -> bytes:
        if self._whole is None:
            try:
                self._whole = binascii.a2b_base64(self.data)
            except (binascii.Error, ValueError):
                self._whole = b""
        return self._whole

    def size(self) -> int:
        """About how many bytes the string holds (padding and stray characters aside)."""
        return len(self.data) * 3 // 4


def image_size(data: str) -> Size | None:
    """(width, height) from a PNG, JPEG, GIF or WebP header in base64 `data`; None when it is none of them."""
    reader = Base64Bytes(data)
    head = reader.read(0, 32)
    if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR" and len(head) >= 24:
        return _positive(*struct.unpack(">II", head[16:24]))
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return _positive(*struct.unpack("<HH", head[6:10]))
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP" and len(head) >= 30:
        return _webp_size(head)
    if head[:2] == b"\xff\xd8":
        return _jpeg_size(reader)
    return None


def _positive(width: int, height: int) -> Size | None:
    return (width, height) if width > 0 and height > 0 else None


def _webp_size(head: bytes) -> Size | None:
    chunk = head[12:16]
    if chunk == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", head[26:30])
        return _positive(width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L" and head[20:21] == b"\x2f":
        bits = int.from_bytes(head[21:25], "little")
        return _positive((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X":
        return _positive(int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1)
    return None


def _jpeg_size(reader: Base64Bytes) -> Size | None:
    """Walk the JPEG's segments by their lengths to the frame header, reading a few bytes at each."""
    at = 2
    for _ in range(JPEG_MAX_SEGMENTS):
        head = reader.read(at, 9)
        if len(head) < 4 or head[0] != 0xFF:
            return None
        marker = head[1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _JPEG_FRAMES and len(head) == 9:
            height, width = struct.unpack(">HH", head[5:9])
            return _positive(width, height)
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # segments without a length
            at += 2
            continue
        if marker in (0xD9, 0xDA):  # the end, or the scan before any frame header
            return None
        at += 2 + struct.unpack(">H", head[2:4])[0]
    return None


def pdf_pages(data: str) -> int | None:
    """How many pages the PDF in base64 `data` has; None when it is not a PDF or they cannot be found.

    Remembered by a digest of `data`: the same PDF comes back in every later turn, and hashing it costs a
    sixth of decoding it."""
    key = hashlib.sha256(data.encode("ascii", "replace")).digest()[:16]
    with _pages_lock:
        if key in _pages:
            _pages.move_to_end(key)
            return _pages[key]
    pages = _read_pages(Base64Bytes(data).whole())
    with _pages_lock:
        _pages[key] = pages
        if len(_pages) > PAGES_REMEMBERED:
            _pages.popitem(last=False)
    return pages


def _read_pages(pdf: bytes) -> int | None:
    if not pdf[:1024].lstrip().startswith(b"%PDF-"):
        return None
    if found := _LINEARIZED.search(pdf, 0, 2048):  # a linearized file states its page count up front
        return int(found.group(1)) or None
    return _counted_pages(pdf) or _counted_pages(_object_streams(pdf)) or None


def _counted_pages(pdf: bytes) -> int:
    """The page tree's own count (the largest /Count of a /Pages node: its root), else the /Page objects."""
    counts = [0]
    for node in _PAGES_COUNT.finditer(pdf):
        start, end = pdf.rfind(b"obj", 0, node.start()), pdf.find(b"endobj", node.end())
        if start >= 0 and end >= 0 and (count := _COUNT.search(pdf, start, end)):
            counts.append(int(count.group(1)))
    return max(counts) or sum(1 for _ in _PAGE.finditer(pdf))


def _object_streams(pdf: bytes) -> bytes:
    """The inflated object streams (PDF 1.5 keeps page objects in them), at most `OBJECT_STREAM_MAX` in all."""
    out: list[bytes] = []
    budget = OBJECT_STREAM_MAX
    for stream in _OBJECT_STREAM.finditer(pdf):
        end = pdf.find(b"endstream", stream.end())
        if end < 0 or budget <= 0:
            break
        try:
            inflated = zlib.decompressobj().decompress(pdf[stream.end() : end], budget)
        except zlib.error:
            continue
        out.append(inflated)
        budget -= len(inflated)
    return b"\n".join(out)


def openai_image_tokens(size: Size | None, detail: Any = "auto") -> int:
    """What OpenAI bills for one image; an image of unknown size (a URL, an unreadable header) as the largest."""
    if detail == "low":
        return OPENAI_LOW_DETAIL
    width, height = map(float, size or (OPENAI_SHORT_SIDE, OPENAI_FIT))  # the most tiles the rule can leave
    scale = min(1.0, OPENAI_FIT / max(width, height))
    width, height = width * scale, height * scale
    scale = min(1.0, OPENAI_SHORT_SIDE / min(width, height))
    width, height = width * scale, height * scale
    tiles = math.ceil(width / OPENAI_TILE_PX) * math.ceil(height / OPENAI_TILE_PX)
    return OPENAI_BASE + OPENAI_TILE * tiles


def anthropic_image_tokens(size: Size | None) -> int:
    """What Anthropic bills for one image; an image of unknown size as the largest it bills after resizing."""
    if size is None:
        return ANTHROPIC_MAX_IMAGE
    width, height = size
    scale = min(1.0, ANTHROPIC_LONG_EDGE / max(width, height))
    return min(ANTHROPIC_MAX_IMAGE, math.ceil(width * scale * (height * scale) / ANTHROPIC_PIXELS_PER_TOKEN))


def pdf_tokens(data: str | None, page_image_tokens: int) -> int:
    """A PDF's pages, each its text and its image (`page_image_tokens`, by the API's image rule)."""
    pages = pdf_pages(data) if data else None
    if pages is None:
        pages = max(1, math.ceil(Base64Bytes(data).size() / PDF_BYTES_PER_PAGE)) if data else 1
    return pages * (PDF_TEXT_PER_PAGE + page_image_tokens)


OPENAI_PAGE_IMAGE = openai_image_tokens(PAGE_PIXELS)
ANTHROPIC_PAGE_IMAGE = anthropic_image_tokens(PAGE_PIXELS)


def openai_part_tokens(part: Any) -> int:
    """Tokens of one OpenAI content part that is not text: chat's `image_url` and `file`, Responses'
    `input_image` and `input_file` (and `computer_screenshot`); 0 for any other part."""
    if not isinstance(part, dict):
        return 0
    kind = part.get("type")
    if kind in ("image_url", "input_image", "computer_screenshot"):
        url = part.get("image_url")
        detail = part.get("detail")
        if isinstance(url, dict):  # chat: {"image_url": {"url": ..., "detail": ...}}
            detail = url.get("detail", detail)
            url = url.get("url")
        inline = data_url(url)
        return openai_image_tokens(image_size(inline[1]) if inline else None, detail)
    if kind in ("file", "input_file"):
        file = part.get("file")
        inline = data_url((file if isinstance(file, dict) else part).get("file_data"))
        return pdf_tokens(inline[1] if inline else None, OPENAI_PAGE_IMAGE)
    return 0


def openai_content_tokens(content: Any) -> int:
    """Tokens of the images and files in an OpenAI message's content (a list of parts; a string has none)."""
    if not isinstance(content, list):
        return 0
    return sum(openai_part_tokens(part) for part in content if isinstance(part, dict) and part.get("type") != "text")


def anthropic_block_tokens(block: Any) -> int:
    """Tokens of one Anthropic `image` or PDF `document` block; 0 for any other block (text is counted as text)."""
    if not isinstance(block, dict):
        return 0
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    inline = source.get("data") if source.get("type") == "base64" and isinstance(source.get("data"), str) else None
    if block.get("type") == "image":
        return anthropic_image_tokens(image_size(inline) if inline else None)
    if block.get("type") == "document" and source.get("type") in ("base64", "url", "file"):
        return pdf_tokens(inline, ANTHROPIC_PAGE_IMAGE)
    if block.get("type") == "document" and source.get("type") == "content":
        parts = source.get("content")
        return sum(anthropic_block_tokens(part) for part in parts) if isinstance(parts, list) else 0
    return 0
