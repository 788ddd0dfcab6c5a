"""Deterministic test images: a seeded RGB picture as PNG bytes, written with the standard
library alone (zlib and struct), so the image tests need no image package."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    """A ``width`` x ``height`` RGB PNG of seeded random pixels: the same bytes for the same
    arguments."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + row.tobytes() for row in pixels)  # filter type 0 on every scanline

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def write_png(path: Path, width: int, height: int, seed: int = 0) -> Path:
    path = Path(path)
    path.write_bytes(png_bytes(width, height, seed))
    return path
