"""Images in requests to the server: inline only, handed to the session as bytes.

A client sends an image as a ``data:`` URL (``data:image/png;base64,...``, the scheme in any
case), in a chat message's ``image_url`` part or in a decision's ``images``. The server fetches
nothing and reads no file a request names: it decodes each URL here, with the parser the session
uses (``bmoe.image_refs``), and passes the session the bytes, never a string that could be a path.
Whether the bytes are an image the projector can read is the session's question.
"""

from __future__ import annotations

from collections.abc import Sequence

from bmoe.image_refs import ImageError, image_bytes
from bmoe.server.errors import ApiError


def inline_bytes(urls: Sequence[str], param: str) -> tuple[bytes, ...]:
    """Each URL's bytes, or a 400 naming ``param`` (``param.index`` for a list of images)."""
    out = []
    for i, url in enumerate(urls):
        where = f"{param}.{i}" if param.endswith("images") else param
        try:
            out.append(image_bytes(url, where, paths=False))
        except ImageError as e:
            raise ApiError(400, str(e), where, e.code) from None
    return tuple(out)
