"""An image's width and height, read from its header before anything decodes it.

A small file can hold a huge image (a 1-bit 20000 x 20000 PNG compresses to ~48 KB and decodes
to 1.2 GB of pixels), so the size is checked on the header, in pure Python, for every format the
projector's decoder takes (PNG, JPEG, GIF, BMP: ``llama/mtmd.py``). A header that is cut short
or says nothing sensible is refused here too (``ImageError``), never handed to the decoder.
"""

from __future__ import annotations

import struct

from bmoe.image_refs import ImageError

# The most pixels bmoe lets the decoder make of one image, whatever the context: 2^25, a little
# over 8K UHD (7680 x 4320). Decoded as RGB with the projector's float copies that is ~0.5 GB.
MAX_PIXELS = 1 << 25

# JPEG markers that start a frame (SOF0..SOF15, less DHT, JPG and DAC) and hold its size.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _cut(name: str, fmt: str) -> ImageError:
    return ImageError(f"{name} is corrupt: its {fmt} header is cut short or malformed")


def _png(data: bytes, name: str) -> tuple[int, int]:
    if len(data) < 24 or data[12:16] != b"IHDR":
        raise _cut(name, "PNG")
    return struct.unpack(">II", data[16:24])


def _gif(data: bytes, name: str) -> tuple[int, int]:
    """The logical screen, and every frame's own box (a frame may reach past the screen)."""
    if len(data) < 13:
        raise _cut(name, "GIF")
    w, h = struct.unpack("<HH", data[6:10])
    i = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)
    while i < len(data):
        b = data[i]
        if b == 0x2C:  # image descriptor
            if i + 10 > len(data):
                break
            x, y, fw, fh, flags = struct.unpack("<HHHHB", data[i + 1 : i + 10])
            w, h = max(w, x + fw), max(h, y + fh)
            i += 10 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0) + 1  # + LZW code size
            i = _skip_blocks(data, i)
        elif b == 0x21:  # extension: label, then sub-blocks
            i = _skip_blocks(data, i + 2)
        else:  # 0x3B trailer, or anything else: stb stops there too
            break
    return w, h


def _skip_blocks(data: bytes, i: int) -> int:
    while i < len(data) and data[i]:
        i += data[i] + 1
    return i + 1


def _jpeg(data: bytes, name: str) -> tuple[int, int]:
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            raise _cut(name, "JPEG")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # no length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in _SOF:
            if i + 9 > len(data) or length < 7:
                break
            h, w = struct.unpack(">HH", data[i + 5 : i + 9])
            return w, h
        if marker in (0xD9, 0xDA) or length < 2:  # end, or scan data before any frame
            break
        i += 2 + length
    raise _cut(name, "JPEG")


def _bmp(data: bytes, name: str) -> tuple[int, int]:
    if len(data) < 26:
        raise _cut(name, "BMP")
    (hsize,) = struct.unpack("<I", data[14:18])
    if hsize == 12:  # OS/2 BITMAPCOREHEADER
        return struct.unpack("<HH", data[18:22])
    w, h = struct.unpack("<ii", data[18:26])
    return abs(w), abs(h)  # a negative height is a top-down bitmap


_READERS = {"PNG": _png, "GIF": _gif, "JPEG": _jpeg, "BMP": _bmp}


def image_size(data: bytes, fmt: str, name: str) -> tuple[int, int]:
    """``(width, height)`` of ``data``, an image of format ``fmt`` (``llama.mtmd.image_format``),
    from its header; ImageError naming ``name`` when the header is cut short or malformed."""
    w, h = _READERS[fmt](data, name)
    if w <= 0 or h <= 0:
        raise ImageError(f"{name} is corrupt: its {fmt} header says {w}x{h} pixels")
    return w, h


def refuse_oversize(name: str, fmt: str, w: int, h: int) -> None:
    """ImageError when ``w x h`` is more pixels than bmoe decodes for any context."""
    if w * h > MAX_PIXELS:
        raise ImageError(
            f"{name} is a {w}x{h} {fmt} ({w * h} pixels): more than the {MAX_PIXELS} pixels bmoe "
            "decodes; scale it down before sending it",
            "image_too_large",
        )
