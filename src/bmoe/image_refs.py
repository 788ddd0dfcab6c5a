"""Image references in requests, parsed in one place for every surface (docs/decide.md#images).

A request names an image as a ``data:`` URL, a file path, or (from Python and the server) the
image's bytes. URL schemes are case-insensitive (RFC 3986), so ``DATA:`` is a data URL, never a
path; any ``scheme://`` URL is refused (bmoe fetches nothing). A caller that must not open files
(the server) turns its references into bytes here with ``paths=False`` and hands the session only
bytes.
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path

from bmoe.errors import RequestError

ImageSource = str | bytes  # a data: URL or a file path, or the image's bytes

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
DATA_URL_HINT = "data:image/png;base64,..."


class ImageError(RequestError):
    """A request's image is none bmoe will read (its reference, or its bytes: ``llama/mtmd.py``
    raises it too); nothing was prefilled. ``code`` says which kind, for the server's errors."""

    def __init__(self, message: str, code: str = "invalid_image") -> None:
        super().__init__(message)
        self.code = code


def kind(source: str) -> str:
    """``"data"`` (a data: URL in any case), ``"url"`` (any other ``scheme://``) or ``"path"``."""
    m = _SCHEME.match(source)
    if m is not None:
        if m.group(1).lower() == "data":
            return "data"
        if source[m.end() : m.end() + 2] == "//":
            return "url"
    return "path"


def shown(source: ImageSource) -> str:
    """A short form of a reference for messages."""
    if isinstance(source, bytes):
        return f"{len(source)} bytes"
    return source if len(source) <= 43 else source[:40] + "..."


def decode_data_url(source: str, name: str) -> bytes:
    head, sep, body = source.partition(",")
    if not sep or not head.lower().endswith(";base64"):
        raise ImageError(f"{name} is a data: URL that is not base64 (give {DATA_URL_HINT})", "bad_data_url")
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{name} is a data: URL whose base64 does not decode", "bad_data_url") from None


def image_bytes(source: ImageSource, name: str, *, paths: bool) -> bytes:
    """The bytes ``source`` names. ``paths=False`` refuses a file path without looking at it (so a
    reply never tells whether a path exists). ImageError names ``name`` and what is wrong."""
    if isinstance(source, bytes):
        return source
    k = kind(source)
    if k == "data":
        return decode_data_url(source, name)
    if k == "url":
        raise ImageError(
            f"{name} is a remote URL; bmoe does no network fetches, so it cannot read it: send "
            f"the image inline as a data: URL ({DATA_URL_HINT})",
            "remote_image_url",
        )
    if not paths:
        raise ImageError(
            f"{name} is not a data: URL; the server reads no files or other URLs a request "
            f"names: send the image inline as a data: URL ({DATA_URL_HINT})",
            "image_not_inline",
        )
    path = Path(source)
    try:
        if path.is_dir():
            raise ImageError(f"{name} is a folder, not an image file", "image_not_found")
        if not path.is_file():
            raise ImageError(f"{name}: file not found", "image_not_found")
        return path.read_bytes()
    except OSError as e:
        raise ImageError(f"{name}: cannot read it: {e.strerror or e}", "image_not_found") from None
