"""Decide's text port over a Runtime (``LlamaText``): prompts rendered by the chat template
generate() uses and tokenized as the engine feeds them, images placed at their markers, choices
tokenized bare. It holds no model state (docs/decide.md)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from bmoe.decide.errors import DecideRequestError
from bmoe.image_refs import ImageError, ImageSource
from bmoe.runtime.chat import Message
from bmoe.runtime.images import count_markers
from bmoe.runtime.runtime import Runtime

_POOL: ThreadPoolExecutor | None = None


def _tokenizer_pool() -> ThreadPoolExecutor:
    """One worker thread for the whole process: tokenizing is short, sessions can share it."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(1, thread_name_prefix="bmoe-tokenize")
    return _POOL


class LlamaText:
    """The ``TextPort`` over a Runtime: its template, tokenizer and image reader."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def render_user(self, text: str, history: Sequence[tuple[str, str]] = ()) -> str:
        before = [Message(r, c) for r, c in history]  # type: ignore[arg-type]  # roles checked by the caller
        return self._rt.render(before + [Message("user", text)], think=False)

    def tokenize_prompts(self, texts: Sequence[str], images: Sequence[ImageSource] = ()) -> list[list[int]]:
        # llama_tokenize releases the GIL and only reads the vocabulary, so the others run on a
        # worker thread while this one does the first: the two tokenizations of a 3000-token
        # prompt take 3 ms instead of 5.5 ms on a core left idle (bench/decide.py).
        if images:
            return self._with_images(texts, images)
        if len(texts) < 2:
            return [self._rt.tokenize_prompt(t) for t in texts]
        others = [_tokenizer_pool().submit(self._rt.tokenize_prompt, t) for t in texts[1:]]
        first = self._rt.tokenize_prompt(texts[0])
        return [first] + [f.result() for f in others]

    def _with_images(self, texts: Sequence[str], images: Sequence[ImageSource]) -> list[list[int]]:
        """Each text's tokens, its k markers taking the request's first k images (read once for
        all the texts); a bad image is a refusal of the request, named as its field."""
        try:
            read = self._rt.read_images(images)
            return [self._rt.tokenize_prompt(t, read[: count_markers(t)]) for t in texts]
        except ImageError as exc:
            raise DecideRequestError(f"decide: {exc}", field="images") from None

    def tokenize_choice(self, text: str) -> list[int]:
        return self._rt.model.tokenize(text, add_special=False, parse_special=False)

    def token_piece(self, token: int) -> str:
        return self._rt.model.token_bytes(token).decode("utf-8", errors="replace")
