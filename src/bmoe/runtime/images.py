"""Images in prompts: reading a request's images, placing them in its tokens, prefilling them.

A prompt with images is still a list of ints, so that everything that compares prompts (the KV
reuse, decide's prefix split and kept state) works on it unchanged: each image stands as a run of
``n_tokens`` equal negative ids, its *placeholder*, derived from the image's SHA-256 (the same
file is the same run; another image differs at the run's first id). Around it are the text tokens
the projector wants (Qwen-VL's ``<|vision_start|>`` and ``<|vision_end|>``).

``ImageRuns`` is what the KV bookkeeping (``runtime/kv.py``) asks about a placeholder: how many
cells and positions its image spans (an image's tokens share positions under M-RoPE, so a
sequence's next position is not its token count after one), and to prefill it. An image is
encoded by the projector when it is prefilled, not when it is read: a prefix restored from the
kept state never encodes its image again. The last few encodings are kept, keyed by image, so an
image prefilled again (a decision after a miss, the same screenshot in the next suffix) is not
encoded twice.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from bmoe import rules
from bmoe.errors import RequestError
from bmoe.image_refs import ImageSource, image_bytes, shown
from bmoe.llama.context import LlamaContext
from bmoe.llama.mtmd import Image, Projector

# Encodings kept (by image) for an image prefilled again: a few screenshots' worth.
KEEP_ENCODED = 4
# Read images kept (their pixels, preprocessed) beyond the request being answered: an image only
# needs them while a prompt holding it is prefilled, and that prompt was read in the same request.
KEEP_READ = 16


def placeholder(image: Image) -> int:
    """The id every token of ``image`` stands as: negative, below -1 (-1 is an unknown token)."""
    digest = image.key or hashlib.sha256(f"{image.width}x{image.height}".encode()).hexdigest()
    return -(2 + int(digest[:15], 16))


def is_placeholder(token: int) -> bool:
    return token < -1


class ImageRuns:
    """The images a session's prompts hold, by placeholder, and their prefill."""

    def __init__(self, projector: Projector) -> None:
        self.projector = projector
        self._images: OrderedDict[int, Image] = OrderedDict()  # placeholder -> its image (what mtmd prefills)
        self._spans: dict[int, tuple[int, int]] = {}  # placeholder -> (n_tokens, n_pos), for good (tiny)
        self._encoded: OrderedDict[int, np.ndarray] = OrderedDict()
        self.n_encoded = 0  # images the vision encoder ran on, since open (tests count it)

    @property
    def marker(self) -> str:
        return rules.IMAGE_MARKER

    # --- requests ---------------------------------------------------------------------
    def read(self, sources: Sequence[ImageSource], n_ctx: int | None = None) -> list[Image]:
        """Each of a request's images (a file path, a ``data:`` URL or its bytes), read and tokenized;
        a RequestError naming the image (by its index) and what is wrong with it. An image too big
        for a context of ``n_ctx`` tokens is refused from its header, before it is decoded."""
        while len(self._images) > KEEP_READ:  # only between requests: this one's are read below
            self._images.popitem(last=False)
        out = []
        for i, source in enumerate(sources):
            name = f"images[{i}] ({shown(source)})"
            out.append(self.projector.load(image_bytes(source, name, paths=True), name, n_ctx))
        return out

    def tokens(self, image: Image) -> list[int]:
        """The tokens ``image`` stands as in a prompt (its placeholder run, and the text around it)."""
        ph = placeholder(image)
        self._images[ph] = image
        self._images.move_to_end(ph)
        self._spans[ph] = (image.n_tokens, image.n_pos)
        return [*image.before, *([ph] * image.n_tokens), *image.after]

    # --- the KV bookkeeping's questions ---------------------------------------------------
    def span(self, token: int) -> tuple[int, int]:
        """``(n_tokens, n_pos)`` of the image whose placeholder is ``token``."""
        span = self._spans.get(token)
        if span is None:
            raise RequestError(f"token {token} is no image's placeholder this session knows")
        return span

    def prefill(self, ctx: LlamaContext, token: int, pos0: int, seq: int = 0) -> None:
        """Prefill the image whose placeholder is ``token`` at position ``pos0``."""
        image = self._images.get(token)
        if image is None:
            raise RequestError(f"token {token}: the image of this placeholder was not read in this request")
        embd = self._encoded.get(token)
        if embd is None:
            embd = self.projector.encode(image)
            self.n_encoded += 1
            self._encoded[token] = embd
            while len(self._encoded) > KEEP_ENCODED:
                self._encoded.popitem(last=False)
        else:
            self._encoded.move_to_end(token)
        self.projector.prefill(ctx, image, embd, pos0, seq)

    def close(self) -> None:
        self._encoded.clear()
        self._images.clear()
        self._spans.clear()
        self.projector.close()


def split_at_markers(parts: Sequence[tuple[str, bool]], *, raw: bool = False) -> list[list[tuple[str, bool]]]:
    """A rendered prompt's ``(text, plain)`` parts cut at every image marker a message's text
    (a plain part) holds: the pieces between the markers, one more than there are markers. A raw
    prompt (``raw``: no template, all of it the client's own markup) is cut at every marker."""
    pieces: list[list[tuple[str, bool]]] = [[]]
    for text, plain in parts:
        if not plain and not raw:
            pieces[-1].append((text, plain))
            continue
        segs = text.split(rules.IMAGE_MARKER)
        for k, seg in enumerate(segs):
            if k:
                pieces.append([])
            if seg:
                pieces[-1].append((seg, plain))
    return pieces


def count_markers(text: str) -> int:
    return text.count(rules.IMAGE_MARKER)
