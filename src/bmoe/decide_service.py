"""DecideService: a session's decide settings, kept prefix state and adapter, in one place.

Created only for sessions opened with decide on, so a session without it allocates nothing.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from bmoe.decide.decider import DecidePolicy, run_decide, run_many
from bmoe.decide.llama_backend import LlamaDecideBackend
from bmoe.decide.prefix_cache import LastPrefixCache, resolve_prefix_cache
from bmoe.decide.types import DecideRequest, DecideResult

if TYPE_CHECKING:
    from bmoe.session import Session


class DecideService:
    def __init__(self, session: "Session") -> None:
        self.policy = DecidePolicy(prefix_cache=resolve_prefix_cache(
            session.config.decide_prefix_cache, prefill_device=session.config.prefill_device is not None))
        self.cache = LastPrefixCache()
        self.backend = LlamaDecideBackend(session, kept=lambda: self.cache.kept)

    def decide(self, request: DecideRequest) -> DecideResult:
        return run_decide(self.backend, self.cache, request, self.policy)

    def decide_many(self, requests: Sequence[DecideRequest]) -> list[DecideResult]:
        return run_many(self.backend, self.cache, requests, self.policy)

    def drop(self) -> None:
        self.cache.drop()
        self.backend.forget()
