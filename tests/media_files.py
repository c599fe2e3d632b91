"""Small valid image and PDF files made here, byte by byte (no imaging library): what the media tests send."""

from __future__ import annotations

import base64
import random
import struct
import zlib


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, noisy_rows: int = 0, seed: int = 7) -> bytes:
    """An RGB PNG: black, but for `noisy_rows` rows of random pixels (they do not compress: they set its size)."""
    rng = random.Random(seed)
    blank = b"\x00" * (3 * width)
    rows = [b"\x00" + (rng.randbytes(3 * width) if y < noisy_rows else blank) for y in range(height)]
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(b"".join(rows), 9)) + _chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def jpeg(width: int, height: int, exif_bytes: int = 0) -> bytes:
    """A baseline JPEG's segments up to its scan: JFIF, an APP1 of `exif_bytes` (the frame header comes after
    it, as in a camera's file), a quantisation table, the frame header (SOF0) with the size, then EOI."""
    jfif = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    app1 = b"\xff\xe1" + struct.pack(">H", exif_bytes + 2) + bytes(exif_bytes) if exif_bytes else b""
    dqt = b"\xff\xdb" + struct.pack(">H", 67) + b"\x00" + bytes(range(1, 65))
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return b"\xff\xd8" + jfif + app1 + dqt + sof + b"\xff\xd9"


def gif(width: int, height: int) -> bytes:
    """A one-colour GIF89a."""
    screen = struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    image = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02\x02\x44\x01\x00"
    return b"GIF89a" + screen + image + b"\x3b"


def webp(width: int, height: int, kind: str = "VP8X") -> bytes:
    """A WebP's RIFF header and first chunk, lossy (`VP8 `), lossless (`VP8L`) or extended (`VP8X`)."""
    if kind == "VP8 ":
        chunk = b"\x00\x00\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height) + bytes(10)
    elif kind == "VP8L":
        bits = (width - 1) | (height - 1) << 14
        chunk = b"\x2f" + bits.to_bytes(4, "little") + bytes(5)
    else:
        chunk = b"\x00" * 4 + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    body = kind.encode() + struct.pack("<I", len(chunk)) + chunk
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


def pdf(pages: int, size: int = 0, seed: int = 11) -> bytes:
    """A PDF of `pages` pages, each with a line of text, padded to about `size` bytes by an embedded file of
    random bytes (what makes a real PDF big: images, fonts)."""
    rng = random.Random(seed)
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(pages)).encode()
    objects.append(b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % pages)
    for i in range(pages):
        text = b"BT /F1 12 Tf 72 720 Td (Page %d of the test document.) Tj ET" % (i + 1)
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R >>" % (4 + 2 * i))
        objects.append(b"<< /Length %d >>\nstream\n" % len(text) + text + b"\nendstream")
    if size:
        filler = rng.randbytes(size)
        objects.append(b"<< /Type /EmbeddedFile /Length %d >>\nstream\n" % len(filler) + filler + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
