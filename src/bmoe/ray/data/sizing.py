"""What one bmoe actor asks Ray for: CPUs, memory, and optionally one unit of a flash resource.

memory = weights + KV + overhead. Weights and KV are the session's footprint
(``bmoe.tools.footprint``: the weights resident or streamed with the most the expert cache holds,
the KV at the most sequences the session may open, ``decide_batch`` side sequences included);
overhead is a fixed allowance for llama.cpp's compute buffers, Python and the Ray worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from bmoe.config import SessionConfig
from bmoe.errors import ConfigError
from bmoe.tools import footprint

MIB = 2**20
OVERHEAD_MB = 512  # compute buffers at n_ubatch 512, the Python interpreter with bmoe and Ray's worker


@dataclass(frozen=True, slots=True)
class ActorSizing:
    """One actor's Ray resources, and the parts its memory was added up from (bytes)."""

    num_cpus: float
    memory: int
    resources: dict[str, float]
    weights: int | None  # None (with kv and overhead) when the memory was given, not computed
    kv: int | None
    overhead: int | None

    def describe(self) -> str:
        extra = "".join(f", {k}={v:g}" for k, v in self.resources.items())
        parts = (
            "given"
            if self.weights is None or self.kv is None or self.overhead is None
            else f"weights {self.weights / MIB:.0f} + KV {self.kv / MIB:.0f} + overhead {self.overhead / MIB:.0f}"
        )
        return f"num_cpus={self.num_cpus:g}, memory={self.memory / MIB:.0f} MiB ({parts}){extra}"


def actor_sizing(
    config: SessionConfig, *, num_cpus: float = 1.0, memory_mb: int | None = None, flash_resource: str | None = None
) -> ActorSizing:
    """The resources one actor of ``config`` asks for; ``memory_mb`` replaces the computed memory,
    which is then not computed at all (the model need not say what it would take)."""
    if num_cpus <= 0:
        raise ConfigError(f"num_cpus: must be > 0, got {num_cpus}")
    resources = {flash_resource: 1.0} if flash_resource else {}
    if memory_mb is not None:
        return ActorSizing(
            num_cpus=num_cpus, memory=memory_mb * MIB, resources=resources, weights=None, kv=None, overhead=None
        )
    if config.moe_stream and config.cache_mb == "auto" and not config.cache_ceil_mb:
        raise ConfigError(
            "cache_mb: auto sizes the cache from the RAM of whichever node the actor lands on; "
            "for Ray give --cache-mb N, or a ceiling with --cache-ceil-mb, or --actor-memory-mb"
        )
    try:
        need = footprint(config)
    except ConfigError as e:
        raise ConfigError(f"{e}; give the actor memory yourself (--actor-memory-mb)") from None
    overhead = OVERHEAD_MB * MIB
    return ActorSizing(
        num_cpus=num_cpus,
        memory=need.weights + need.kv + overhead,
        resources=resources,
        weights=need.weights,
        kv=need.kv,
        overhead=overhead,
    )
