"""Images in requests to the server: inline only.

A client sends an image as a ``data:`` URL (``data:image/png;base64,...``), in a chat message's
``image_url`` part or in a decision's ``images``. The server fetches nothing (an http(s) URL is
refused as such) and reads no file a request names (a path is refused too): what the session
reads is only what the client sent. Whether the bytes are an image the projector can read is the
session's question; its refusal is the 400's message.
"""
from __future__ import annotations

from collections.abc import Sequence

from .errors import ApiError

INLINE = "send the image inline as a data: URL (data:image/png;base64,...)"


def _shown(url: str) -> str:
    return url if len(url) <= 60 else url[:57] + "..."


def check_inline(urls: Sequence[str], param: str) -> None:
    """Refuse (400, naming ``param``.index) an image that is not a ``data:`` URL."""
    for i, url in enumerate(urls):
        head = url[:8].lower()
        where = f"{param}.{i}" if param.endswith("images") else param
        if head.startswith(("http://", "https://")):
            raise ApiError(400, f"{where}: {_shown(url)} is a remote URL; this server does no network fetches, "
                           f"so it cannot read it: {INLINE}", where, "remote_image_url")
        if not head.startswith("data:"):
            raise ApiError(400, f"{where}: {_shown(url)} is not a data: URL; the server reads no files or other "
                           f"URLs a request names: {INLINE}", where, "image_not_inline")
