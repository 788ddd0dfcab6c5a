"""The one adapter implementing DecideBackend over a live session's llama.cpp context.

It drives the session's own KV bookkeeping, so whatever a decision leaves in the context
is known to the next generate(). Two shortcuts keep a restored decision close to the cost of
its new tokens, both exact:
- restore by trimming: when the sequence still holds the kept prefix followed by the last
  decision's suffix (an agent's next step), cutting the suffix off leaves exactly the kept
  state, with no copy; memory that cannot be cut (recurrent layers) takes the copy instead;
- stores reuse a buffer whose pages are already in memory, instead of faulting in new ones.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable

import numpy as np

from bmoe.chat import Message
from bmoe.decide.errors import DecideBackendError
from bmoe.decide.port import KeptState, PrefillCost
from bmoe.decide.prefix_cache import KeptPrefix

if TYPE_CHECKING:
    from bmoe.session import Session

UNKNOWN_TOKEN = -1


class LlamaDecideBackend:
    def __init__(self, session: "Session", kept: Callable[[], KeptPrefix | None] = lambda: None) -> None:
        self._s = session
        self._kept = kept  # what the prefix cache keeps now: its tokens, and which buffer is in use
        self._logits: np.ndarray | None = None
        self._pool: list[np.ndarray] = []  # at most two state buffers: the kept one and a spare

    # --- prompt side (no model state) -------------------------------------------------
    def render_user(self, text: str) -> str:
        return self._s.render([Message("user", text)], think=False)

    def tokenize_prompt(self, text: str) -> list[int]:
        return self._s.tokenize_prompt(text)

    def tokenize_choice(self, text: str) -> list[int]:
        return self._s.model.tokenize(text, add_special=False, parse_special=False)

    def token_piece(self, token: int) -> str:
        return self._s.model.token_bytes(token).decode("utf-8", errors="replace")

    def n_ctx(self) -> int:
        return self._s.n_ctx

    # --- sequence side ----------------------------------------------------------------
    def clear(self) -> None:
        self._s.kv.reset()
        self._logits = None

    def prefill(self, tokens: Sequence[int], n_past: int) -> PrefillCost:
        kv = self._s.kv
        if n_past != kv.n_past:
            raise DecideBackendError(f"decide: prefill at position {n_past} but the sequence holds {kv.n_past} tokens")
        io0, dev0 = self._s.io_snapshot(), self._s.ctx.n_dev_tokens
        t0 = time.perf_counter()
        self._logits = kv.append(list(tokens))
        prefill_s = time.perf_counter() - t0
        with_device = self._s.prefill_device is not None
        io = self._s.io_snapshot()
        streaming = self._s.config.moe_stream
        return PrefillCost(
            n_tokens=len(tokens),
            prefill_s=prefill_s,
            read_mb=io.minus(io0).read_bytes / 1e6 if streaming else None,
            cache_hit_pct=io.hit_pct if streaming else None,
            prefill_dev_tokens=self._s.ctx.n_dev_tokens - dev0 if with_device else None,
        )

    def last_logits(self) -> np.ndarray:
        if self._logits is None:
            raise DecideBackendError("decide: no logits: nothing was prefilled")
        return self._logits

    def save_state(self) -> KeptState:
        ctx = self._s.ctx
        buf = ctx.state_bytes(out=self._spare_buffer(ctx.state_size()))
        return KeptState(data=buf, n_tokens=self._s.kv.n_past)

    def _spare_buffer(self, size: int) -> np.ndarray:
        """A pool buffer the kept state does not live in, grown (untouched pages) when too small."""
        kept = self._kept()
        in_use = kept.state.data if kept is not None and isinstance(kept.state.data, np.ndarray) else None
        busy = [b for b in self._pool if in_use is not None and np.shares_memory(b, in_use)]
        free = [b for b in self._pool if not any(b is k for k in busy)]
        buf = free[0] if free and free[0].nbytes >= size else np.empty(size + size // 4, dtype=np.uint8)
        self._pool = busy + [buf]  # headroom above: a grown prefix usually fits the same buffer
        return buf

    def load_state(self, state: KeptState) -> None:
        kv = self._s.kv
        kept = self._kept()
        tokens = list(kept.tokens) if kept is not None and kept.state is state else None
        n = state.n_tokens
        if tokens is not None and kv.tokens[:n] == tokens and (kv.n_past == n or self._s.ctx.trim(n)):
            del kv.tokens[n:]  # the sequence already is the kept state: no copy
            self._logits = None
            return
        try:
            self._s.ctx.load_state_bytes(state.data)
        except Exception:
            kv.reset()
            raise
        kv.tokens = tokens if tokens is not None else [UNKNOWN_TOKEN] * n
        self._logits = None
