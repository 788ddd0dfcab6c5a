"""KvSequence: which tokens the context's sequence holds, and how to reach a new prompt.

A new prompt reuses the longest common token prefix with what is in the KV; the divergent
tail is trimmed. Memory that cannot be trimmed (recurrent layers) falls back to a full
prefill and says why.

Someone may still need the first n tokens' state after the next request (decide keeps the
state after a prompt's prefix in the sequence itself, uncopied): ``guard(n, save)`` makes
every operation that would remove one of those positions call ``save`` first, once.

A prompt may hold images (``runtime/images.py``): each a run of placeholder ids, prefilled whole by
the projector. Such a run is never cut: a reused prefix ends before it or after it. And after an
image the next position is not the token count (an image's tokens share positions under M-RoPE):
``pos_of(n)`` is the position of token ``n``, what llama.cpp's positions and cuts are counted in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np

from bmoe.errors import RequestError
from bmoe.llama.context import ContextError, LlamaContext
from bmoe.numerics import common_prefix_len
from bmoe.runtime.images import ImageRuns, is_placeholder


@dataclass(frozen=True, slots=True)
class KvPlan:
    n_reused: int
    fallback: str  # "" when the prefix was reused as planned


class KvSequence:
    def __init__(self, ctx: LlamaContext, images: ImageRuns | None = None) -> None:
        self.ctx = ctx
        self.images = images
        self.tokens: list[int] = []
        self._guard: tuple[int, Callable[[], None]] | None = None

    # --- images -----------------------------------------------------------------------
    def _runs(self, tokens: Sequence[int], end: int) -> list[tuple[int, int, int]]:
        """The image runs that start before ``end`` in ``tokens``: ``(start, n_tokens, n_pos)``."""
        if self.images is None or end <= 0:
            return []
        arr = np.fromiter(tokens[:end], dtype=np.int64, count=min(end, len(tokens)))
        idx = np.flatnonzero(arr < -1)
        runs: list[tuple[int, int, int]] = []
        k, n_idx = 0, len(idx)
        while k < n_idx:
            start = int(idx[k])
            n_tok, n_pos = self.images.span(int(arr[start]))
            runs.append((start, n_tok, n_pos))
            k = int(np.searchsorted(idx, start + n_tok))  # the next run starts after this one
        return runs

    def pos_of(self, n: int, tokens: Sequence[int] | None = None) -> int:
        """The position of token ``n`` of ``tokens`` (the sequence's own by default): ``n`` but
        where images before it span fewer (or more) positions than tokens."""
        toks = self.tokens if tokens is None else tokens
        return n + sum(n_pos - n_tok for start, n_tok, n_pos in self._runs(toks, n) if start + n_tok <= n)

    def snap(self, n: int, tokens: Sequence[int] | None = None) -> int:
        """``n``, or the start of the image run ``n`` would cut into: where a piece may end."""
        toks = self.tokens if tokens is None else tokens
        for start, n_tok, _ in self._runs(toks, n):
            if start < n < start + n_tok:
                return start
        return n

    def trim_to(self, n: int) -> bool:
        """Cut the context's memory back to the first ``n`` tokens (the bookkeeping is the
        caller's); False where it cannot be cut (recurrent layers)."""
        return self.ctx.trim(self.pos_of(n))

    def guard(self, n: int, save: Callable[[], None]) -> None:
        """Call ``save()`` (with the sequence still holding its first ``n`` tokens) before any
        operation removes one of them. One guard at a time; it fires at most once."""
        self._guard = (n, save)

    def unguard(self) -> None:
        self._guard = None

    def _before_cut(self, n_keep: int) -> None:
        """About to keep only the first ``n_keep`` positions: let the guard save what it needs (a
        guard may set the next one, over a shorter prefix, which is then asked too)."""
        while self._guard is not None and n_keep < self._guard[0]:
            save = self._guard[1]
            self._guard = None
            save()

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def reset(self) -> None:
        self._before_cut(0)
        self.ctx.clear()
        self.tokens = []

    def align(self, prompt: Sequence[int], *, reuse: bool = True) -> KvPlan:
        """Keep the reusable prefix of ``prompt`` in the KV; the caller prefills the rest.

        At least one token is always left to prefill: the next token's logits come from it, so
        an empty ``prompt`` is refused before anything changes (it would trim to -1).
        """
        if not prompt:
            raise RequestError("prompt: has no tokens; a prompt needs at least one")
        if not reuse:
            self.reset()
            return KvPlan(0, "")
        n = self.snap(min(common_prefix_len(self.tokens, prompt), len(prompt) - 1), prompt)
        if n < len(self.tokens):
            self._before_cut(n)
            if n == 0 or not self.trim_to(n):
                why = "" if n == 0 else f"memory cannot be trimmed to {n} tokens (recurrent layers): full prefill"
                self.reset()
                return KvPlan(0, why)
            del self.tokens[n:]
        return KvPlan(n, "")

    def append(self, tokens: Sequence[int], *, logits: Literal["last", "all", "none"] = "last") -> np.ndarray | None:
        pieces = self._pieces(tokens, logits)
        try:
            out = None
            pos = self.pos_of(self.n_past)
            for piece in pieces:
                if is_placeholder(piece[0]):
                    assert self.images is not None
                    self.images.prefill(self.ctx, piece[0], pos)
                    pos += self.images.span(piece[0])[1]
                else:
                    out = self.ctx.decode(piece, pos, logits=logits if piece is pieces[-1] else "none")
                    pos += len(piece)
        except BaseException:
            # A failed decode leaves the KV in an unknown state: start clean next time. Whatever
            # it did get in (the n_batch pieces before the failing one) is cut off first, so
            # that the guard's save sees exactly the n_past tokens the bookkeeping knows of, not
            # positions past them. BaseException: a KeyboardInterrupt between two pieces must not
            # leave the bookkeeping behind the KV either.
            self.trim_to(self.n_past)
            self.reset()
            raise
        self.tokens.extend(int(t) for t in tokens)
        return out

    def _pieces(self, tokens: Sequence[int], logits: str) -> list[Sequence[int]]:
        """``tokens`` cut into text runs and whole images, checked before anything is decoded:
        an image is only ever prefilled whole, and the logits come from text after it."""
        runs = self._runs(tokens, len(tokens))
        if not runs:
            return [tokens]
        pieces: list[Sequence[int]] = []
        at = 0
        for start, n_tok, _ in runs:
            if start + n_tok > len(tokens) or any(t != tokens[start] for t in tokens[start : start + n_tok]):
                raise ContextError("a prefill would cut an image: its tokens are not all in this piece")
            if start > at:
                pieces.append(tokens[at:start])
            pieces.append(tokens[start : start + n_tok])
            at = start + n_tok
        if at < len(tokens):
            pieces.append(tokens[at:])
        if is_placeholder(pieces[-1][0]) and logits != "none" or (logits == "all" and len(pieces) > 1):
            raise ContextError(
                "logits after an image: a prompt must end with text after its last image, and "
                "no logits are read at an image's tokens"
            )
        return pieces

    def rollback(self, n_keep: int) -> None:
        """Return to the first n_keep tokens (used when a turn is cancelled)."""
        if n_keep >= len(self.tokens):
            return
        n_keep = self.snap(n_keep)
        self._before_cut(n_keep)
        if n_keep > 0 and self.trim_to(n_keep):
            del self.tokens[n_keep:]
        else:
            self.reset()
