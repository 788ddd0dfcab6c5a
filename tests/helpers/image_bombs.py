"""Small files that are huge images (decompression bombs), written by hand, and a spy on the
decoder: what the header check must refuse before anything decodes them (issue #38 item 3)."""

from __future__ import annotations

import functools
import struct
import zlib

import llama_cpp.mtmd_cpp as mtmd
import pytest


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


@functools.lru_cache(maxsize=4)
def png_bomb(width: int = 20000, height: int = 20000) -> bytes:
    """A valid 1-bit grayscale PNG of ``width x height`` black pixels: ~48 KB at 20000 x 20000."""
    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte 0, then the packed bits
    z = zlib.compressobj(9)
    data = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")


def jpeg_header(width: int, height: int) -> bytes:
    """A JPEG's start (SOI, an APP0, a baseline SOF0 naming ``width x height``), no scan data."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def gif_header(width: int, height: int, frame: tuple[int, int] | None = None) -> bytes:
    """A GIF89a with a ``width x height`` screen and one ``frame`` (default: the screen's size)."""
    fw, fh = frame or (width, height)
    return (
        b"GIF89a"
        + struct.pack("<HHBBB", width, height, 0, 0, 0)
        + b"\x2c"
        + struct.pack("<HHHHB", 0, 0, fw, fh, 0)
        + b"\x02\x02\x44\x01\x00\x3b"
    )


def bmp_header(width: int, height: int) -> bytes:
    """A 24-bit BITMAPINFOHEADER BMP of ``width x height`` with no pixel data."""
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(info), 0, 0, 14 + len(info)) + info


class DecoderSpy:
    """Counts the calls into mtmd's image decoder (``mtmd_helper_bitmap_init_from_buf``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = mtmd.mtmd_helper_bitmap_init_from_buf

        def spy(*args):  # type: ignore[no-untyped-def]
            self.calls += 1
            return real(*args)

        monkeypatch.setattr(mtmd, "mtmd_helper_bitmap_init_from_buf", spy)
