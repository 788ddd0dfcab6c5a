"""The streaming engine the llama hook drives: route -> (cache plan, reads, commit).

``on_route(il, ids)`` is called from inside llama.cpp's graph evaluation, right after layer
``il``'s router picked its experts and before the expert matmuls run; when it returns, every
routed expert of that layer is present in the buffers the layer's expert tensors are bound to.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .cache import LruCache, SharedBuffers
from .layout import ExpertTensor, ModelLayout
from .options import Budget, StreamOptions, resolve_budget
from .reader import ExpertReader, StreamIOError, stderr_warn


class RouteError(StreamIOError):
    """The router reported an expert id outside 0..n_expert-1 or an unknown layer (sticky)."""


@dataclass(frozen=True, slots=True)
class StreamStats:
    """Cumulative since open; subtract two snapshots for per-token numbers."""
    read_bytes: int       # expert bytes read from the GGUF (sum of routed slices read)
    device_bytes: int     # bytes asked of the kernel, O_DIRECT alignment included
    io_s: float           # time inside reads
    mgmt_s: float         # time in cache bookkeeping (plan, evict, commit) and id handling
    hits: int
    misses: int
    routed: int           # distinct (layer, expert) per route, summed; hits + misses == routed
    evictions: int
    resident_bytes: int
    budget_bytes: int     # 0 = cache off
    n_routes: int         # on_route calls (one per MoE layer per ubatch)

    @property
    def cache_enabled(self) -> bool:
        return self.budget_bytes > 0


@dataclass(frozen=True, slots=True)
class Binding:
    """Where a stacked expert tensor must point: its ggml ``->data``."""
    name: str
    il: int
    proj: str
    nbytes: int
    data_addr: int


class Streamer:
    def __init__(self, layout: ModelLayout, options: StreamOptions = StreamOptions(), *,
                 budget: Budget | None = None, warn: Callable[[str], None] = stderr_warn) -> None:
        self.layout = layout
        self.options = options
        self.budget = budget if budget is not None else resolve_budget(options, layout, warn=warn)
        self.reader = ExpertReader([f for f in layout.files], odirect=options.odirect,
                                   io_threads=options.io_threads, warn=warn)
        self.cache: LruCache | SharedBuffers = (
            LruCache(layout, self.budget.budget_bytes) if self.budget.budget_bytes > 0 else SharedBuffers(layout)
        )
        self._layers = frozenset(layout.layers)
        self._first_layer = layout.layers[0]
        self._by_name = layout.by_name()
        self._mgmt_s = 0.0
        self._routed = 0
        self._n_routes = 0

    # --- what the hook binds ------------------------------------------------------------
    def binding(self, name: str) -> Binding | None:
        """The buffer a ggml tensor named ``name`` must be rebound to, or None if it does not stream."""
        t: ExpertTensor | None = self._by_name.get(name)
        if t is None:
            return None
        return Binding(t.name, t.il, t.proj, t.nbytes, self.cache.data_addr(t))

    def bindings(self) -> tuple[Binding, ...]:
        return tuple(b for b in (self.binding(t.name) for t in self.layout.experts) if b is not None)

    # --- the route ------------------------------------------------------------------------
    def on_route(self, il: int, expert_ids: np.ndarray) -> None:
        """Make layer ``il``'s routed experts (any shape of int ids, e.g. [n_tokens, k]) present."""
        t0 = time.perf_counter()
        self.reader.raise_if_failed()
        experts = np.unique(np.asarray(expert_ids, dtype=np.int64))  # the ubatch's union, ascending
        if experts.size and (experts[0] < 0 or experts[-1] >= self.layout.n_expert):
            self._fail_route(f"router of layer {il} picked expert ids {experts.tolist()} outside "
                             f"0..{self.layout.n_expert - 1}")
        if il not in self._layers:
            self._fail_route(f"layer {il} routed experts but the GGUF has no expert tensors for it")
        if self.options.read_all:  # verification mode: the routed subset must not matter
            experts = np.arange(self.layout.n_expert, dtype=np.int64)
        if il == self._first_layer:
            self.reader.verify_files()  # once per ubatch: a replaced file must not feed a token
        plan = self.cache.plan(il, experts.tolist())
        t1 = time.perf_counter()
        self.reader.read(plan.ops)
        t2 = time.perf_counter()
        self.cache.commit(plan)
        self._routed += len(experts)
        self._n_routes += 1
        self._mgmt_s += (t1 - t0) + (time.perf_counter() - t2)

    def stats(self) -> StreamStats:
        r = self.reader.stats()
        c = self.cache.counters()
        return StreamStats(
            read_bytes=r.read_bytes, device_bytes=r.device_bytes, io_s=r.io_s, mgmt_s=self._mgmt_s,
            hits=c.hits, misses=c.misses, routed=self._routed, evictions=c.evictions,
            resident_bytes=c.resident_bytes, budget_bytes=c.budget_bytes, n_routes=self._n_routes,
        )

    @property
    def error(self) -> StreamIOError | None:
        return self.reader.error

    def raise_if_failed(self) -> None:
        self.reader.raise_if_failed()

    def close(self) -> None:
        self.reader.close()
        self.cache.close()

    def _fail_route(self, msg: str) -> None:
        err = RouteError(msg + "; streaming stopped for this session")
        try:
            self.reader.fail(err)
        except StreamIOError:
            raise err from None
