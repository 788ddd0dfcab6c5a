"""StreamStats: the one record of what expert streaming did, from the streamer to every report.

The reader, the cache and the streamer each count their part of it, the streamer joins them; telemetry (BMOE_PROGRESS/LOAD/DONE/STATS/DECIDE), the server's metrics,
the tests and the benchmarks read it. It is cumulative since the session opened: subtract two
(``later.minus(earlier)``) for a token's, a request's or a benchmark phase's figures. A resident
model's is all zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

# A field marked as a gauge is a level, not a running total: ``minus`` keeps the later value.
_GAUGE = {"gauge": True}


@dataclass(frozen=True, slots=True)
class StreamStats:
    read_bytes: int = 0  # expert bytes read from the GGUF (sum of the slices read)
    device_bytes: int = 0  # bytes asked of the kernel, O_DIRECT alignment included
    n_syscalls: int = 0  # read calls made (adjacent experts are read in one)
    io_s: float = 0.0  # read time: per route, wall time from queueing its reads to the last one done
    stall_s: float = 0.0  # time the graph (so compute) waited for reads not yet done
    mgmt_s: float = 0.0  # time in cache bookkeeping (plan, evict, commit), id handling, queueing reads
    hits: int = 0
    misses: int = 0
    routed: int = 0  # distinct (layer, expert) per route, summed; hits + misses == routed
    evictions: int = 0
    n_routes: int = 0  # routes served (one per MoE layer per ubatch)
    guessed: int = 0  # --prefetch: experts read ahead of their route on a guess
    guess_hits: int = 0  # ... of which the route really picked
    wasted_bytes: int = 0  # ... bytes read for guesses the route did not pick (part of read_bytes)
    resident_bytes: int = field(default=0, metadata=_GAUGE)  # expert bytes the cache holds now
    budget_bytes: int = field(default=0, metadata=_GAUGE)  # the cache's budget; 0 = cache off

    def plus(self, other: "StreamStats") -> "StreamStats":
        """Field-wise sum: how the streamer joins what its parts count (the reader counts bytes and
        time, the cache hits and residency, the streamer routes and guesses; each part leaves the
        others' fields at zero)."""
        return StreamStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def minus(self, before: "StreamStats") -> "StreamStats":
        """What happened between ``before`` and this snapshot (gauges keep this one's value)."""
        return StreamStats(
            **{
                f.name: getattr(self, f.name)
                if f.metadata.get("gauge")
                else getattr(self, f.name) - getattr(before, f.name)
                for f in fields(self)
            }
        )

    @property
    def cache_on(self) -> bool:
        return self.budget_bytes > 0

    @property
    def hit_pct(self) -> float:
        """Cache hit rate in percent; -1 with no cache (the protocol's convention)."""
        if not self.cache_on:
            return -1.0
        looked = self.hits + self.misses
        return 100.0 * self.hits / looked if looked else 0.0

    @property
    def prefetch_hit_pct(self) -> float | None:
        """Share of guessed experts the router picked; None when nothing was guessed."""
        return 100.0 * self.guess_hits / self.guessed if self.guessed else None
