"""Prometheus metrics, in a registry of the app's own (two apps in one process do not mix).

Counters move when the worker finishes a request, from the session's own result objects, so they
count exactly what the BMOE_DONE / BMOE_DECIDE lines would report.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from bmoe.decide.types import DecideResult
from bmoe.session import GenerateResult, ScoreResult

MIB = 2**20


def reuse_label(r: DecideResult) -> str:
    """BMOE_DECIDE's reuse value with its variable part cut ("miss: prefix differs at token 7" -> "miss")."""
    if r.error is not None:
        return "refused" if r.refused else "failed"
    return r.reuse.split(":", 1)[0] or "none"


class Metrics:
    def __init__(self, queue_depth: Callable[[], int], stats: Callable[[], dict]) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("bmoe_http_requests", "HTTP requests answered", ["route", "status"], registry=r)
        self.chat = Counter("bmoe_chat_completions", "Chat turns finished", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter(
            "bmoe_prompt_tokens", "Prompt tokens prefilled (chat, decide and completions)", registry=r
        )
        self.reused_tokens = Counter(
            "bmoe_reused_tokens", "Prompt tokens reused from the KV or a kept prefix state", registry=r
        )
        self.completion_tokens = Counter("bmoe_completion_tokens", "Tokens generated", registry=r)
        self.prefill_seconds = Counter("bmoe_prefill_seconds", "Seconds spent prefilling", registry=r)
        self.decode_seconds = Counter("bmoe_decode_seconds", "Seconds spent decoding", registry=r)
        self.read_mib = Counter("bmoe_flash_read_mib", "MiB of experts read from flash", registry=r)
        self.decisions = Counter(
            "bmoe_decisions", "Decisions answered, by what happened to the kept prefix state", ["reuse"], registry=r
        )
        self.cancelled = Counter("bmoe_cancelled", "Requests cancelled because the client went away", registry=r)
        self.rejected = Counter(
            "bmoe_queue_rejected", "Requests refused with 503 because the queue was full", registry=r
        )
        Gauge("bmoe_queue_depth", "Requests waiting plus the one running", registry=r).set_function(queue_depth)
        Gauge(
            "bmoe_expert_cache_hit_percent", "Expert cache hit rate so far in the session; -1 with no cache", registry=r
        ).set_function(lambda: float(stats().get("cache_hit_pct", -1.0)))
        Gauge("bmoe_context_tokens", "Tokens in the session's context now", registry=r).set_function(
            lambda: float(stats().get("n_past", 0))
        )
        self._state_store_gauges(stats)

    def _state_store_gauges(self, stats: Callable[[], dict]) -> None:
        """The store of kept prefix states, per tier: its own counts since the session opened."""
        r = self.registry

        def count(key: str) -> Callable[[], float]:
            return lambda: float(stats().get("state_store", {}).get(key, 0))

        for name, doc, keys in (
            ("bmoe_state_store_hits", "Kept prefix states found, by tier", ("hits_ram", "hits_disk")),
            (
                "bmoe_state_store_tier_misses",
                "Lookups a tier did not answer (disk: those RAM did not answer either, flash tier on)",
                ("misses_ram", "misses_disk"),
            ),
            ("bmoe_state_store_bytes", "Bytes of kept prefix states held, by tier", ("bytes_ram", "bytes_disk")),
            ("bmoe_state_store_states", "Kept prefix states held, by tier", ("states_ram", "states_disk")),
            ("bmoe_state_store_evictions", "Kept prefix states evicted, by tier", ("evictions_ram", "evictions_disk")),
        ):
            g = Gauge(name, doc, ["tier"], registry=r)
            for tier, key in zip(("ram", "disk"), keys):
                g.labels(tier).set_function(count(key))
        Gauge("bmoe_state_store_misses", "Lookups that found no kept prefix state", registry=r).set_function(
            count("misses")
        )
        Gauge(
            "bmoe_state_store_corrupt", "State files found damaged or replaced, deleted and recomputed", registry=r
        ).set_function(count("corrupt_disk"))

    def chat_turn(self, r: GenerateResult, finish_reason: str) -> None:
        self.chat.labels(finish_reason).inc()
        self.prompt_tokens.inc(r.n_prompt)
        self.reused_tokens.inc(r.n_reused)
        self.completion_tokens.inc(r.n_tokens)
        self.prefill_seconds.inc(r.prefill_s)
        self.decode_seconds.inc(r.decode_s)
        self.read_mib.inc(r.io.read_bytes / MIB)

    def decision(self, r: DecideResult) -> None:
        self.decisions.labels(reuse_label(r)).inc()
        if r.error is None:
            self.prompt_tokens.inc(r.n_tokens - r.n_reused)
            self.reused_tokens.inc(r.n_reused)
            self.prefill_seconds.inc(r.prefill_s)
            self.read_mib.inc((r.read_mb or 0.0) * 1e6 / MIB)

    def completion(self, results: list[ScoreResult]) -> None:
        """The prompts of one /v1/completions request, scored."""
        for r in results:
            self.prompt_tokens.inc(r.n_prefilled)
            self.reused_tokens.inc(r.n_reused)
            self.completion_tokens.inc(len(r.generated))
            self.prefill_seconds.inc(r.prefill_s)
            self.read_mib.inc(r.io.read_bytes / MIB)

    def render(self) -> bytes:
        return generate_latest(self.registry)
