"""The streaming engine the llama hook drives: route -> (cache plan, reads, commit).

``on_route(il, ids)`` is called from inside llama.cpp's graph evaluation, right after layer
``il``'s router picked its experts and before the expert matmuls run. It queues every read of
the route at once, one group per projection, and by default waits for all of them: when it
returns, every routed expert of that layer is present in the buffers the layer's expert tensors
are bound to.

Split phase: once the hook knows in which order layer ``il``'s matmuls consume the projections
and where it can stop the graph before a later one, it calls ``set_schedule(il, order,
deferred)``. Then ``on_route`` queues the groups in ``order`` and waits only for the
projections not ``deferred``; those stay ``pending`` until ``wait(proj)`` (the hook calls it
just before their matmul) or ``drain()``. The cache records a route's misses only after its
last wait, and every route (and ``drain``) first waits for what the previous one left.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Collection, Sequence

import numpy as np

from .cache import LruCache, Plan, SharedBuffers
from .layout import ExpertTensor, ModelLayout
from .options import Budget, StreamOptions, resolve_budget
from .reader import Batch, ExpertReader, StreamIOError, stderr_warn


class RouteError(StreamIOError):
    """The router reported an expert id outside 0..n_expert-1 or an unknown layer (sticky)."""


@dataclass(frozen=True, slots=True)
class StreamStats:
    """Cumulative since open; subtract two snapshots for per-token numbers."""
    read_bytes: int       # expert bytes read from the GGUF (sum of routed slices read)
    device_bytes: int     # bytes asked of the kernel, O_DIRECT alignment included
    io_s: float           # read time: per route, wall time from queueing its reads to the last one done
    stall_s: float        # time the caller (the graph, so compute) waited for reads not yet done
    mgmt_s: float         # time in cache bookkeeping (plan, evict, commit), id handling, queueing reads
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
        self._projs = {il: tuple(dict.fromkeys(t.proj for t in layout.layer_tensors(il))) for il in layout.layers}
        self._schedule: dict[int, tuple[tuple[str, ...], frozenset[str]]] = {}
        self._inflight: _Route | None = None

    # --- what the hook binds ------------------------------------------------------------
    def binding(self, name: str) -> Binding | None:
        """The buffer a ggml tensor named ``name`` must be rebound to, or None if it does not stream."""
        t: ExpertTensor | None = self._by_name.get(name)
        if t is None:
            return None
        return Binding(t.name, t.il, t.proj, t.nbytes, self.cache.data_addr(t))

    def bindings(self) -> tuple[Binding, ...]:
        return tuple(b for b in (self.binding(t.name) for t in self.layout.experts) if b is not None)

    def projections(self, il: int) -> tuple[str, ...]:
        """The projections layer ``il`` streams, in the layout's order."""
        return self._projs[il]

    # --- the route ------------------------------------------------------------------------
    def set_schedule(self, il: int, order: Sequence[str], deferred: Collection[str] = ()) -> None:
        """From now on, queue layer ``il``'s reads in ``order`` (the order its matmuls consume
        them) and leave ``deferred`` projections pending when ``on_route`` returns."""
        order, deferred = tuple(order), frozenset(deferred)
        if il not in self._projs or sorted(order) != sorted(self._projs[il]) or not deferred <= set(order):
            raise ValueError(f"schedule {order} deferring {sorted(deferred)} does not fit layer {il}, "
                             f"which streams {self._projs.get(il)}")
        self._schedule[il] = (order, deferred)

    def on_route(self, il: int, expert_ids: np.ndarray) -> None:
        """Read layer ``il``'s routed experts (any shape of int ids, e.g. [n_tokens, k]); when it
        returns, all of them are present except the projections its schedule defers."""
        self.drain()
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
        order, deferred = self._schedule.get(il, (self._projs[il], frozenset()))
        batch = self.reader.submit([plan.ops_of(p) for p in order])
        self._inflight = _Route(plan, len(experts), order, batch)
        self._mgmt_s += time.perf_counter() - t0
        for p in order:
            if p not in deferred:
                self.wait(p)

    @property
    def pending(self) -> tuple[str, ...]:
        """Projections of the current route whose reads have not been waited for, in queue order."""
        r = self._inflight
        return () if r is None else tuple(p for i, p in enumerate(r.order) if not r.batch.is_waited(i))

    def wait(self, proj: str) -> None:
        """Return once ``proj``'s reads of the current route are in place (at once if they are,
        or if nothing is pending); raises the sticky StreamIOError if a read failed."""
        r = self._inflight
        if r is None or proj not in r.order:
            return
        try:
            r.batch.wait(r.order.index(proj))
        except BaseException:
            self._inflight = None  # nothing of it is in flight now; its misses are not recorded
            raise
        if r.batch.done:
            t0 = time.perf_counter()
            self._inflight = None
            self.cache.commit(r.plan)
            self._routed += r.n_experts
            self._n_routes += 1
            self._mgmt_s += time.perf_counter() - t0

    def drain(self) -> None:
        """Wait for everything the current route still has in flight (and record it)."""
        for p in self.pending:
            self.wait(p)

    def stats(self) -> StreamStats:
        r = self.reader.stats()
        c = self.cache.counters()
        return StreamStats(
            read_bytes=r.read_bytes, device_bytes=r.device_bytes, io_s=r.io_s, stall_s=r.stall_s, mgmt_s=self._mgmt_s,
            hits=c.hits, misses=c.misses, routed=self._routed, evictions=c.evictions,
            resident_bytes=c.resident_bytes, budget_bytes=c.budget_bytes, n_routes=self._n_routes,
        )

    @property
    def error(self) -> StreamIOError | None:
        return self.reader.error

    def raise_if_failed(self) -> None:
        self.reader.raise_if_failed()

    def close(self) -> None:
        r, self._inflight = self._inflight, None
        if r is not None:
            r.batch.abandon()  # the buffers go away below: nothing may still write into them
        self.reader.close()
        self.cache.close()

    def _fail_route(self, msg: str) -> None:
        err = RouteError(msg + "; streaming stopped for this session")
        try:
            self.reader.fail(err)
        except StreamIOError:
            raise err from None


@dataclass(slots=True)
class _Route:
    """A route whose reads are queued: recorded in the cache once all its groups are waited."""
    plan: Plan
    n_experts: int
    order: tuple[str, ...]
    batch: Batch
