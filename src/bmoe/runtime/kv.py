"""KvSequence: which tokens the context's sequence holds, and how to reach a new prompt.

A new prompt reuses the longest common token prefix with what is in the KV; the divergent
tail is trimmed. Memory that cannot be trimmed (recurrent layers) falls back to a full
prefill and says why.

Someone may still need the first n tokens' state after the next request (decide keeps the
state after a prompt's prefix in the sequence itself, uncopied): ``guard(n, save)`` makes
every operation that would remove one of those positions call ``save`` first, once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np

from ..errors import RequestError
from ..llama.context import LlamaContext
from ..numerics import common_prefix_len


@dataclass(frozen=True, slots=True)
class KvPlan:
    n_reused: int
    fallback: str  # "" when the prefix was reused as planned


class KvSequence:
    def __init__(self, ctx: LlamaContext) -> None:
        self.ctx = ctx
        self.tokens: list[int] = []
        self._guard: tuple[int, Callable[[], None]] | None = None

    def guard(self, n: int, save: Callable[[], None]) -> None:
        """Call ``save()`` (with the sequence still holding its first ``n`` tokens) before any
        operation removes one of them. One guard at a time; it fires at most once."""
        self._guard = (n, save)

    def unguard(self) -> None:
        self._guard = None

    def _before_cut(self, n_keep: int) -> None:
        """About to keep only the first ``n_keep`` positions: let the guard save what it needs."""
        if self._guard is not None and n_keep < self._guard[0]:
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
        n = min(common_prefix_len(self.tokens, prompt), len(prompt) - 1)
        if n < len(self.tokens):
            self._before_cut(n)
            if n == 0 or not self.ctx.trim(n):
                why = "" if n == 0 else f"memory cannot be trimmed to {n} tokens (recurrent layers): full prefill"
                self.reset()
                return KvPlan(0, why)
            del self.tokens[n:]
        return KvPlan(n, "")

    def append(self, tokens: Sequence[int], *, logits: Literal["last", "all", "none"] = "last") -> np.ndarray | None:
        try:
            out = self.ctx.decode(tokens, self.n_past, logits=logits)
        except BaseException:
            # A failed decode leaves the KV in an unknown state: start clean next time. Whatever
            # it did get in (the n_batch pieces before the failing one) is cut off first, so
            # that the guard's save sees exactly the n_past tokens the bookkeeping knows of, not
            # positions past them. BaseException: a KeyboardInterrupt between two pieces must not
            # leave the bookkeeping behind the KV either.
            self.ctx.trim(self.n_past)
            self.reset()
            raise
        self.tokens.extend(int(t) for t in tokens)
        return out

    def rollback(self, n_keep: int) -> None:
        """Return to the first n_keep tokens (used when a turn is cancelled)."""
        if n_keep >= len(self.tokens):
            return
        self._before_cut(n_keep)
        if n_keep > 0 and self.ctx.trim(n_keep):
            del self.tokens[n_keep:]
        else:
            self.reset()
