"""The streaming engine the llama hook drives: route -> (cache plan, reads, commit).

``on_route(il, ids)`` runs inside llama.cpp's graph, after layer ``il``'s router and before its
expert matmuls: it queues the route's reads, one group per projection, and waits for those the
schedule does not defer (``set_schedule``; ``wait``/``drain`` for the rest). ``prefetch(il,
guess)`` queues a guessed layer's reads ahead of its router; the next route takes them over and
reads only what the guess missed, ``wasted_bytes`` counting wrong guesses so that ``read_bytes``
stays exact. docs/streaming.md ("Split-phase reads", "Speculative prefetch", "Read-ahead two
layers deep") gives the rules and why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Collection, Sequence

import numpy as np

from bmoe.stream.budget import Budget, StreamSettings, resolve_budget
from bmoe.stream.cache import ExpertCache, ExpertKey, ReadPlan, SharedBuffers, SlotCache, slots_refusal
from bmoe.stream.layout import ExpertTensor, ModelLayout
from bmoe.stream.page_mover import PageMover
from bmoe.stream.policy import POLICIES, Uses
from bmoe.stream.reader import Batch, ExpertReader, StreamIOError, stderr_warn
from bmoe.stream.stats import StreamStats


class RouteError(StreamIOError):
    """The router reported an expert id outside 0..n_expert-1 or an unknown layer (sticky)."""


@dataclass(frozen=True, slots=True)
class Binding:
    """Where a stacked expert tensor must point: its ggml ``->data``."""

    name: str
    il: int
    proj: str
    nbytes: int
    data_addr: int
    # With slots (SlotCache): the tensor's ggml ne[2] becomes ``n_slots`` and nb[2] ``expert_stride``;
    # 0 leaves its shape alone.
    n_slots: int = 0
    expert_stride: int = 0


class Streamer:
    def __init__(
        self,
        layout: ModelLayout,
        settings: StreamSettings = StreamSettings(),
        *,
        budget: Budget | None = None,
        warn: Callable[[str], None] = stderr_warn,
        pages: PageMover | None = None,
        buffer_sets: int = 1,
        slots: bool = False,
    ) -> None:
        """``buffer_sets``: with the cache off, 2 gives the layers two sets of buffers in turn, so
        a guess for the next layer can be read while this one computes (costs one more layer of
        expert bytes in RAM); the cache on has buffers per layer anyway. ``slots``: with the cache
        on, a SlotCache where the layout allows it (``slots_refusal``), else page moves; the hook
        then renumbers each route's ids (``slot_map``)."""
        self.layout = layout
        self.settings = settings
        self.budget = budget if budget is not None else resolve_budget(settings, layout, warn=warn)
        self._layers = frozenset(layout.layers)
        self._first_layer = layout.layers[0]
        self._by_name = layout.by_name()
        self._mgmt_s = 0.0
        self._routed = 0
        self._n_routes = 0
        self._projs = {il: tuple(dict.fromkeys(t.proj for t in layout.layer_tensors(il))) for il in layout.layers}
        self._schedule: dict[int, tuple[tuple[str, ...], frozenset[str]]] = {}
        self._inflight: _Route | None = None
        self._last: _Route | None = None  # the latest route, in flight or not (its matmuls may not have run)
        self._ahead: _Ahead | None = None  # a prefetch no route has taken over yet
        self._expert_bytes = {il: layout.expert_nbytes_in_layer(il) for il in layout.layers}
        self._guessed = self._guess_hits = self._wasted = 0
        policy = POLICIES[settings.policy]
        self.cache: SlotCache | ExpertCache | SharedBuffers
        if self.budget.budget_bytes <= 0:
            self.cache = SharedBuffers(layout, sets=buffer_sets)
        elif slots and not slots_refusal(layout):
            self.cache = SlotCache(layout, self.budget.budget_bytes, policy)
        else:
            self.cache = ExpertCache(layout, self.budget.budget_bytes, policy, pages=pages)
        # The reader comes last: its lanes and fds would outlive a constructor that raised after it.
        try:
            self.reader = ExpertReader(
                [f for f in layout.files], odirect=settings.odirect, io_threads=settings.io_threads, warn=warn
            )
        except BaseException:
            self.cache.close()
            raise

    # --- what the hook binds ------------------------------------------------------------
    def binding(self, name: str) -> Binding | None:
        """The buffer a ggml tensor named ``name`` must be rebound to, or None if it does not stream."""
        t: ExpertTensor | None = self._by_name.get(name)
        if t is None:
            return None
        if isinstance(self.cache, SlotCache):
            return Binding(
                t.name, t.il, t.proj, t.nbytes, self.cache.data_addr(t), self.cache.n_slots, self.cache.expert_stride(t)
            )
        return Binding(t.name, t.il, t.proj, t.nbytes, self.cache.data_addr(t))

    def bindings(self) -> tuple[Binding, ...]:
        return tuple(b for b in (self.binding(t.name) for t in self.layout.experts) if b is not None)

    @property
    def slots(self) -> bool:
        """Whether the expert matmuls read slots: each route's ids must be renumbered by ``slot_map``."""
        return isinstance(self.cache, SlotCache)

    def slot_map(self, il: int) -> np.ndarray:
        """Layer ``il``'s slot of each expert (int32 [n_expert], -1 where none). After ``on_route``
        every routed expert of ``il`` has one, and keeps it until that route's matmuls have run."""
        if not isinstance(self.cache, SlotCache):
            raise ValueError("slot_map: this streamer's cache has no slots")
        return self.cache.slot_map(il)

    def projections(self, il: int) -> tuple[str, ...]:
        """The projections layer ``il`` streams, in the layout's order."""
        return self._projs[il]

    # --- the route ------------------------------------------------------------------------
    def set_schedule(self, il: int, order: Sequence[str], deferred: Collection[str] = ()) -> None:
        """From now on, queue layer ``il``'s reads in ``order`` (the order its matmuls consume
        them) and leave ``deferred`` projections pending when ``on_route`` returns."""
        order, deferred = tuple(order), frozenset(deferred)
        if il not in self._projs or sorted(order) != sorted(self._projs[il]) or not deferred <= set(order):
            raise ValueError(
                f"schedule {order} deferring {sorted(deferred)} does not fit layer {il}, "
                f"which streams {self._projs.get(il)}"
            )
        self._schedule[il] = (order, deferred)

    def on_route(self, il: int, expert_ids: np.ndarray) -> None:
        """Read layer ``il``'s routed experts (any shape of int ids, e.g. [n_tokens, k]); when it
        returns, all of them are present except the projections its schedule defers."""
        self._drain_route()
        if self._ahead is not None and self._ahead.il != il:
            self._finish_ahead()  # a guess for another layer: nothing of it serves this route (waited: stall, not mgmt)
        t0 = time.perf_counter()
        self.reader.raise_if_failed()
        if not isinstance(self.cache, SharedBuffers):  # the ubatch's union, ascending, and how its tokens used it
            experts, uses = _union(expert_ids)
        else:  # cache off: only the union (the per-token uses cost ~1 ms a token for nothing)
            experts, uses = np.unique(np.asarray(expert_ids, dtype=np.int64)), None
        if experts.size and (experts[0] < 0 or experts[-1] >= self.layout.n_expert):
            self._fail_route(
                f"router of layer {il} picked expert ids {experts.tolist()} outside 0..{self.layout.n_expert - 1}"
            )
        if il not in self._layers:
            self._fail_route(f"layer {il} routed experts but the GGUF has no expert tensors for it")
        if self.settings.read_all:  # verification mode: the routed subset must not matter
            experts, uses = np.arange(self.layout.n_expert, dtype=np.int64), None
        if il == self._first_layer:
            self.reader.verify_files()  # once per ubatch: a replaced file must not feed a token
        order, deferred = self._schedule.get(il, (self._projs[il], frozenset()))
        ahead, self._ahead = self._ahead, None
        try:
            if ahead is None:
                plan = self.cache.plan(il, experts.tolist(), uses)
                parts: tuple[tuple[Batch, tuple[str, ...]], ...] = (
                    ((self.reader.submit([plan.ops_of(p) for p in order]), order),) if plan.ops else ()
                )
            else:
                routed = experts.tolist()
                fresh = [e for e in routed if e not in ahead.experts]
                wrong = len(ahead.experts) - (len(routed) - len(fresh))
                self._guess_hits += len(routed) - len(fresh)
                self._wasted += wrong * self._expert_bytes[il]
                if not isinstance(self.cache, SharedBuffers):  # the guessed reads are cached already
                    plan = new = self.cache.plan(
                        il, routed, uses, prefetched=ahead.experts, pinned=ahead.experts.difference(routed)
                    )
                else:
                    new = self.cache.plan(il, fresh)
                    plan = ReadPlan(new.ops, 0, tuple(ExpertKey(il, e) for e in routed), new.projs)
                parts = tuple((b, ahead.order) for b in ahead.batches)
                if new.ops:  # what the guess missed goes ahead of the guessed reads still queued
                    urgent = {i for i, p in enumerate(order) if p not in deferred}
                    parts += ((self.reader.submit([new.ops_of(p) for p in order], urgent=urgent), order),)
        except BaseException:
            if ahead is not None:
                for b in ahead.batches:
                    b.abandon()
            raise
        busy = frozenset(experts.tolist()) | (ahead.experts if ahead is not None else frozenset())
        self._inflight = self._last = _Route(il, plan, len(experts), order, parts, busy)
        self._mgmt_s += time.perf_counter() - t0
        if not parts:  # every expert was cached: nothing to read or wait for
            self._finish(self._inflight)
            return
        for p in order:
            if p not in deferred:
                self.wait(p)

    def prefetch(self, il: int, experts: np.ndarray, *, early: bool = False) -> None:
        """Start reading the experts guessed for layer ``il`` before its route.

        The caller guarantees that no matmul still reads an expert buffer of layer ``il``, nor an
        expert the guess may evict, except, with ``early``, those of the latest route: a route of
        another layer whose matmuls are still to run (read-ahead two layers deep; needs
        ``two_deep``). Its experts are then kept and its reads are not waited for; without
        ``early`` the route is waited for first. An older guess for another layer is always
        waited for first; a guess for the layer already being read ahead adds the experts the
        first left out. With the cache on, only guessed experts it does not hold are read."""
        r = self._last
        if early:
            if r is None or r.il == il or self.cache.shares_buffers(r.il, il):
                raise ValueError(
                    f"an early guess for layer {il} needs the route of another layer, with "
                    "buffers apart from it, just before it"
                )
        else:
            self._drain_route()
            r = None
        if self._ahead is not None and self._ahead.il != il:
            self._finish_ahead()
        t0 = time.perf_counter()
        self.reader.raise_if_failed()
        ids = np.unique(np.asarray(experts, dtype=np.int64))
        if il not in self._layers or (ids.size and (ids[0] < 0 or ids[-1] >= self.layout.n_expert)):
            raise ValueError(f"cannot prefetch experts {ids.tolist()} of layer {il}")
        ahead = self._ahead
        new = [e for e in ids.tolist() if ahead is None or e not in ahead.experts]
        order = self._schedule.get(il, (self._projs[il], frozenset()))[0]
        if not isinstance(self.cache, SharedBuffers):
            busy: list[ExpertKey] = [ExpertKey(il, e) for e in ahead.experts] if ahead is not None else []
            if r is not None:
                self._commit(r)  # its misses count against the budget before the guess makes room
                busy += [ExpertKey(r.il, e) for e in r.busy]
            plan = self.cache.reserve(il, new, busy)
        else:
            plan = self.cache.plan(il, new)
        got = frozenset(k.expert for k in plan.misses)
        batch = self.reader.submit([plan.ops_of(p) for p in order]) if plan.ops else None
        if ahead is None:
            self._ahead = _Ahead(il, got, order, [batch] if batch is not None else [])
        else:
            ahead.experts |= got
            if batch is not None:
                ahead.batches.append(batch)
        self._guessed += len(got)
        self._mgmt_s += time.perf_counter() - t0

    @property
    def pending(self) -> tuple[str, ...]:
        """Projections of the current route whose reads have not been waited for, in queue order."""
        r = self._inflight
        return () if r is None else tuple(p for p in r.order if not r.is_waited(p))

    @property
    def two_deep(self) -> bool:
        """Whether a guess for the next layer can be read while a route's matmuls are still to run
        (every pair of consecutive streamed layers has buffers of its own)."""
        ls = self.layout.layers
        return all(not self.cache.shares_buffers(a, b) for a, b in zip(ls, ls[1:]))

    @property
    def prefetching(self) -> int | None:
        """The layer whose guessed experts are being read ahead of its route, if any."""
        return None if self._ahead is None else self._ahead.il

    def wait(self, proj: str) -> None:
        """Return once ``proj``'s reads of the current route are in place (at once if they are,
        or if nothing is pending); raises the sticky StreamIOError if a read failed."""
        r = self._inflight
        if r is None or proj not in r.order:
            return
        try:
            for batch, order in r.parts:  # the prefetch first: its reads were queued first
                batch.wait(order.index(proj))
        except BaseException:
            self._stop_all()  # nothing of it is in flight now; its misses are not recorded
            raise
        if r.done:
            self._finish(r)

    def _finish(self, r: "_Route") -> None:
        """``r``'s reads are all in place: record it, and nothing is in flight any more."""
        t0 = time.perf_counter()
        self._inflight = None
        self._commit(r)
        self._routed += r.n_experts
        self._n_routes += 1
        self._mgmt_s += time.perf_counter() - t0

    def _commit(self, r: "_Route") -> None:
        """Record ``r``'s misses in the cache, once (after its last wait, or earlier for an early guess)."""
        if not r.committed:
            self.cache.commit(r.plan)
            r.committed = True

    def drain(self) -> None:
        """Wait for everything still in flight: the current route (and record it), and a
        prefetch no route took over (its bytes were read for nothing). The caller's graph is done:
        no matmul reads the latest route's experts any more."""
        self._drain_route()
        self._last = None
        if self._ahead is not None:
            self._finish_ahead()

    def _drain_route(self) -> None:
        for p in self.pending:
            self.wait(p)

    def _finish_ahead(self) -> None:
        a, self._ahead = self._ahead, None
        if a is None:
            return
        try:
            for b in a.batches:
                b.wait_all()
        except BaseException:
            self._stop_all()
            raise
        self._wasted += len(a.experts) * self._expert_bytes[a.il]

    def _stop_all(self) -> None:
        """After a failure: let no read of the route or of a prefetch go on writing."""
        r, self._inflight = self._inflight, None
        a, self._ahead = self._ahead, None
        self._last = None
        for batch in ([b for b, _ in r.parts] if r is not None else []) + (a.batches if a is not None else []):
            batch.abandon()

    def stats(self) -> StreamStats:
        """Cumulative since open: the reader's and the cache's counts joined with the routes and
        guesses counted here."""
        own = StreamStats(
            mgmt_s=self._mgmt_s,
            routed=self._routed,
            n_routes=self._n_routes,
            guessed=self._guessed,
            guess_hits=self._guess_hits,
            wasted_bytes=self._wasted,
        )
        return self.reader.stats().plus(self.cache.stats()).plus(own)

    @property
    def error(self) -> StreamIOError | None:
        return self.reader.error

    def raise_if_failed(self) -> None:
        self.reader.raise_if_failed()

    def close(self) -> None:
        self._stop_all()  # the buffers go away below: nothing may still write into them
        self.reader.close()
        self.cache.close()

    def _fail_route(self, msg: str) -> None:
        err = RouteError(msg + "; streaming stopped for this session")
        try:
            self.reader.fail(err)
        except StreamIOError:
            raise err from None


def _union(expert_ids: np.ndarray) -> tuple[np.ndarray, Uses]:
    """The distinct experts of a route, ascending, and for each how many of the ubatch's tokens
    (rows of ``[n_tokens, k]`` ids; a 1-D array is one token) picked it and the last row that did."""
    ids = np.asarray(expert_ids, dtype=np.int64)
    if ids.size == 0:
        return ids.reshape(0), Uses(1, [], [])
    rows = ids.reshape(1, -1) if ids.ndim < 2 else ids.reshape(-1, ids.shape[-1])
    if rows.shape[0] == 1:  # one token (decode): a few ids, where np.unique's machinery is most of the route's cost
        row = rows[0].tolist()
        seen = sorted(set(row))
        return np.array(seen, dtype=np.int64), Uses(1, [row.count(e) for e in seen], [0] * len(seen))
    experts, inverse, counts = np.unique(rows, return_inverse=True, return_counts=True)
    last = np.full(experts.size, -1, dtype=np.int64)
    np.maximum.at(last, inverse.reshape(-1), np.repeat(np.arange(rows.shape[0], dtype=np.int64), rows.shape[1]))
    return experts, Uses(rows.shape[0], counts.tolist(), last.tolist())


@dataclass(slots=True)
class _Route:
    """A route of layer ``il`` whose reads are queued: recorded in the cache once all its groups
    are waited (or earlier, ``committed``, when a guess for the next layer makes room).

    ``parts``: the batches that fill it, each with its groups' projections (the prefetch it took
    over, then its own reads); a projection is in place once its group of every part is.
    ``busy``: the experts its matmuls read or its reads fill (routed and guessed)."""

    il: int
    plan: ReadPlan
    n_experts: int
    order: tuple[str, ...]
    parts: tuple[tuple[Batch, tuple[str, ...]], ...]
    busy: frozenset[int]
    committed: bool = False

    def is_waited(self, proj: str) -> bool:
        return all(b.is_waited(order.index(proj)) for b, order in self.parts)

    @property
    def done(self) -> bool:
        return all(b.done for b, _ in self.parts)


@dataclass(slots=True)
class _Ahead:
    """A speculative prefetch in flight: layer ``il``'s guessed experts, read by ``batches`` (one
    per guess that added experts), each with its groups in ``order``."""

    il: int
    experts: frozenset[int]
    order: tuple[str, ...]
    batches: list[Batch]
