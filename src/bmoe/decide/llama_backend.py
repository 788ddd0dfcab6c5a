"""The one adapter implementing DecideBackend over a live session's llama.cpp context.

It drives the session's own KV bookkeeping, so whatever a decision leaves in the context
is known to the next generate(): a restored state's tokens are unknown ids (-1), which
never match a real prompt, so a chat turn after a decision prefills from scratch.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from bmoe.chat import Message
from bmoe.decide.errors import DecideBackendError
from bmoe.decide.port import KeptState, PrefillCost

if TYPE_CHECKING:
    from bmoe.session import Session

UNKNOWN_TOKEN = -1


class LlamaDecideBackend:
    def __init__(self, session: "Session") -> None:
        self._s = session
        self._logits: np.ndarray | None = None

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
        return KeptState(data=self._s.ctx.state_bytes(), n_tokens=self._s.kv.n_past)

    def load_state(self, state: KeptState) -> None:
        kv = self._s.kv
        try:
            self._s.ctx.load_state_bytes(state.data)
        except Exception:
            kv.reset()
            raise
        kv.tokens = [UNKNOWN_TOKEN] * state.n_tokens
        self._logits = None
