"""Where streamed experts live: the buffers the expert matmuls read, and the cache over them
(docs/streaming.md, "The cache" and "Slots").

Every buffer is an anonymous mapping laid out like the file (a tensor at file offset ``off``
starts at ``base + off % ALIGN``), so O_DIRECT reads land straight in it (reader.py), and pages
are committed only when first written.

- SharedBuffers (cache off): one buffer per projection shared by all layers; ``sets=2`` for
  read-ahead two layers deep, so the next layer's reads never land where this layer reads.
- SlotCache (cache on, the default): one pool of slots per (projection, slice bytes); the policy
  (policy.py) picks which ExpertKey(layer, expert) stay; the hook renumbers each route's expert
  ids to their slots; an incoming expert is read into its victim's slot.
- ExpertCache (cache on without slots, BMOE_CACHE_SLOTS=0): every expert at its own place in a
  buffer per (layer, projection); a victim's whole pages go to the incoming expert through a
  PageMover (page_mover.py) where there is one, and are released otherwise.
"""

from __future__ import annotations

import errno
import heapq
import mmap
from dataclasses import dataclass
from typing import Callable, Collection, Mapping, Sequence, TypeVar

import numpy as np

from bmoe.stream.layout import ExpertTensor, ModelLayout
from bmoe.stream.page_mover import PageMover
from bmoe.stream.policy import DEFAULT_POLICY, CachePolicy, ExpertKey, PolicyFactory, Uses
from bmoe.stream.reader import ALIGN, ReadOp, Window
from bmoe.stream.stats import StreamStats

PAGE = mmap.PAGESIZE
_MAP_NORESERVE = 0x4000  # Linux; not exported by Python's mmap module


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """What a route needs: reads for the misses, and the keys to record once they are read.

    ``projs[i]`` is the projection (``gate``, ``up``, ``down``, ...) whose buffer ``ops[i]`` fills,
    so the streamer can queue and wait for each projection on its own."""

    ops: tuple[ReadOp, ...]
    hits: int
    misses: tuple[ExpertKey, ...]
    projs: tuple[str, ...] = ()

    def ops_of(self, proj: str) -> list[ReadOp]:
        return [op for op, p in zip(self.ops, self.projs, strict=True) if p == proj]


def _pad(t: ExpertTensor) -> int:
    return t.offset % ALIGN


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _buffer_size(tensors: Sequence[ExpertTensor]) -> int:
    """Bytes of the mapping that holds any one of ``tensors`` laid out like the file."""
    return max(_round_up(_pad(t) + t.nbytes, PAGE) for t in tensors)


@dataclass(frozen=True, slots=True)
class _Pages:
    """The pages of one expert's slice in its buffer, from the slice's first page to its last:
    ``[lo, hi)`` covers it, ``[i_lo, i_hi)`` are the whole pages inside it (empty, ``i_lo ==
    i_hi``, for a slice that fills no page of its own). ``left``/``right``: the other experts
    whose slices touch the partial page at ``lo``/``hi - PAGE`` (empty where the slice starts
    or ends on a page boundary)."""

    lo: int
    i_lo: int
    i_hi: int
    hi: int
    left: tuple[int, ...]
    right: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Slices:
    """Where the expert slices of one tensor lie in its buffer. The cache's bookkeeping reads them
    at every eviction, so each expert's pages are computed once (``pages[e]``)."""

    proj: str
    buf: "TensorBuffer"
    size: int  # bytes of one expert's slice
    pages: tuple[_Pages, ...]

    @staticmethod
    def of(proj: str, buf: "TensorBuffer", pad: int, size: int, n: int) -> "_Slices":
        """``n`` slices of ``size`` bytes, expert 0 at ``pad``."""

        def touching(page: int) -> range:  # the experts whose slices touch the page at ``page``
            return range(max(0, (page - pad) // size), min(n - 1, (page + PAGE - 1 - pad) // size) + 1)

        pages = []
        for e in range(n):
            start, end = pad + e * size, pad + (e + 1) * size
            lo, hi = (start // PAGE) * PAGE, _round_up(end, PAGE)
            i_lo, i_hi = _round_up(start, PAGE), (end // PAGE) * PAGE
            if i_hi < i_lo:
                i_hi = i_lo
            left = tuple(x for x in touching(lo) if x != e) if lo < start else ()
            right = tuple(x for x in touching(hi - PAGE) if x != e) if hi > end else ()
            pages.append(_Pages(lo, i_lo, i_hi, hi, left, right))
        return _Slices(proj, buf, size, tuple(pages))


class TensorBuffer:
    """A lazily committed anonymous mapping of ``size`` bytes (``_buffer_size``: big enough for
    the given tensors, one at a time)."""

    def __init__(self, size: int) -> None:
        self.mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            # 4 KiB pages keep commits and DONTNEED releases exact (no 2 MiB THP rounding).
            self.mm.madvise(mmap.MADV_NOHUGEPAGE)
        self.window = Window.over(self.mm)
        self.size = size

    def data_addr(self, t: ExpertTensor) -> int:
        """Where ``t``'s expert 0 starts: the pointer its ggml tensor is rebound to."""
        return self.window.addr + _pad(t)

    def read_op(self, t: ExpertTensor, expert: int) -> ReadOp:
        return ReadOp(
            t.file_index, t.slice_offset(expert), t.slice_nbytes, self.window, _pad(t) + expert * t.slice_nbytes
        )

    def release(self, start: int, end: int) -> int:
        """DONTNEED the whole pages inside [start, end) of the buffer; returns bytes released."""
        lo, hi = _round_up(start, PAGE), (end // PAGE) * PAGE
        if hi <= lo:
            return 0
        self.mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        return hi - lo

    def close(self) -> None:
        self.window.view.release()
        self.mm.close()


_K = TypeVar("_K")


def _map_buffers(sizes: Mapping[_K, int]) -> dict[_K, TensorBuffer]:
    """A TensorBuffer of each size. If one cannot be mapped, those mapped are unmapped and the
    OSError names the expert buffers and their size, not just an errno (ENOMEM:
    vm.overcommit_memory=2 charges a whole mapping at once, MAP_NORESERVE or not)."""
    out: dict[_K, TensorBuffer] = {}
    try:
        for key, size in sizes.items():
            out[key] = TensorBuffer(size)
    except OSError as exc:
        for b in out.values():
            b.close()
        mib = -(-sum(sizes.values()) // (1 << 20))
        why = exc.strerror or str(exc)
        if exc.errno == errno.ENOMEM:
            why += "; with vm.overcommit_memory=2 the kernel charges all of it at once"
        raise OSError(exc.errno, f"cannot map the expert buffers ({mib} MiB of address space): {why}") from exc
    return out


_ReadOps = dict[int, tuple[tuple[str, tuple[ReadOp, ...]], ...]]


def _read_ops(
    tensors: Mapping[int, Sequence[ExpertTensor]], buffer: Callable[[ExpertTensor], TensorBuffer]
) -> _ReadOps:
    """Every (layer, projection, expert) read, built once: per layer, per tensor, its projection and
    the read of each expert into ``buffer(tensor)``. A route only looks them up: an expert's place
    in its buffer never changes."""
    return {
        il: tuple((t.proj, tuple(buffer(t).read_op(t, e) for e in range(t.n_expert))) for t in ts)
        for il, ts in tensors.items()
    }


class SharedBuffers:
    """Cache off: per projection one buffer the layers are bound to; each route re-reads.
    ``sets``: how many such buffers per projection, taken in turn by the streamed layers (the
    i-th streamed layer uses set ``i % sets``)."""

    budget_bytes = 0

    def __init__(self, layout: ModelLayout, sets: int = 1) -> None:
        if sets not in (1, 2):
            raise ValueError(f"SharedBuffers: sets must be 1 or 2, got {sets}")
        self.layout = layout
        self._tensors = {il: layout.layer_tensors(il) for il in layout.layers}
        self._set = {il: i % sets for i, il in enumerate(layout.layers)}
        groups: dict[tuple[int, str], list[ExpertTensor]] = {}
        for t in layout.experts:
            groups.setdefault((self._set[t.il], t.proj), []).append(t)
        self._buffers = _map_buffers({k: _buffer_size(ts) for k, ts in groups.items()})
        self._routed = 0
        self._ops = _read_ops(self._tensors, self._buffer)

    def _buffer(self, t: ExpertTensor) -> TensorBuffer:
        return self._buffers[(self._set[t.il], t.proj)]

    def data_addr(self, t: ExpertTensor) -> int:
        return self._buffer(t).data_addr(t)

    def shares_buffers(self, a: int, b: int) -> bool:
        """Whether layers ``a`` and ``b`` are bound to the same buffers (one's reads overwrite the other's)."""
        return self._set[a] == self._set[b]

    def plan(self, il: int, experts: Sequence[int], uses: Uses | None = None) -> ReadPlan:
        ops = tuple(by_expert[e] for _, by_expert in self._ops[il] for e in experts)
        projs = tuple(p for p, _ in self._ops[il] for _ in experts)
        return ReadPlan(ops, 0, tuple(ExpertKey(il, e) for e in experts), projs)

    def commit(self, plan: ReadPlan) -> None:
        self._routed += len(plan.misses)

    def stats(self) -> StreamStats:
        """The cache's part of the stream's counters: with the cache off every routed expert is a miss."""
        return StreamStats(misses=self._routed)

    def close(self) -> None:
        for b in self._buffers.values():
            b.close()


class _PolicyCache:
    """Cache on, whatever holds the pages: the policy's side of a route (what hits, what misses,
    which residents make room) under ``budget_bytes`` of expert bytes, with
    ``policy(expert_bytes_per_layer, budget_bytes)`` (NextUsePolicy by default). A subclass maps
    the buffers (``_buffers``), hands victims' memory to the incoming experts (``_make_room``) and
    says where each miss is read to (``_reads``)."""

    _buffers: Mapping[object, TensorBuffer]

    def __init__(self, layout: ModelLayout, budget_bytes: int, policy: PolicyFactory = DEFAULT_POLICY) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"{type(self).__name__} needs a positive budget; use SharedBuffers for cache off")
        self.layout = layout
        self.budget_bytes = budget_bytes
        self._tensors = {il: layout.layer_tensors(il) for il in layout.layers}
        self.policy: CachePolicy = policy({il: layout.expert_nbytes_in_layer(il) for il in layout.layers}, budget_bytes)
        self.released_bytes = 0  # pages handed back by DONTNEED (for tests and telemetry)

    def is_resident(self, key: ExpertKey) -> bool:
        return self.policy.is_resident(key)

    def shares_buffers(self, a: int, b: int) -> bool:
        """Every layer's experts have memory of their own: ``a``'s reads never land where ``b``'s matmuls read."""
        return a == b

    def plan(
        self,
        il: int,
        experts: Sequence[int],
        uses: Uses | None = None,
        *,
        prefetched: Collection[int] = (),
        pinned: Collection[int] = (),
    ) -> ReadPlan:
        """Count hits, evict to make room (never this route's experts), return reads for misses.
        ``uses``: how the ubatch's tokens used ``experts`` (None: one token). A prefill ubatch may
        route more of one layer than the budget holds: those experts still have to be present for
        the matmul, so the cache runs over budget until the next route evicts back under it.
        ``prefetched``/``pinned``: see the policy's ``reserve`` (policy.py)."""
        hits, misses, victims = self.policy.plan(il, experts, uses, prefetched=prefetched, pinned=pinned)
        self._make_room(victims, misses)
        return self._reads(il, hits, misses)

    def reserve(self, il: int, experts: Sequence[int], busy: Collection[ExpertKey] = ()) -> ReadPlan:
        """Read-ahead: make room for the guessed ``experts`` not resident and return their reads.
        They count as resident from now on (the policy's ``reserve``): nothing is to commit.
        ``busy``: resident experts a matmul or a read still needs, which no victim may be."""
        missing, victims = self.policy.reserve(il, experts, busy)
        self._make_room(victims, missing)
        return self._reads(il, 0, missing)

    def commit(self, plan: ReadPlan) -> None:
        """Record the misses of ``plan`` as resident, once all their reads have succeeded (the
        streamer commits only after the route's last wait: nothing of it is in flight then)."""
        if plan.misses:
            self.policy.admit(plan.misses[0].layer, plan.misses)

    def stats(self) -> StreamStats:
        """The cache's part of the stream's counters: hits, misses, evictions, residency, budget."""
        p = self.policy
        return StreamStats(
            hits=p.hits,
            misses=p.misses,
            evictions=p.evictions,
            resident_bytes=p.resident_bytes,
            budget_bytes=self.budget_bytes,
        )

    def close(self) -> None:
        for b in self._buffers.values():
            b.close()
        self.policy.clear()

    def _make_room(self, victims: Sequence[ExpertKey], incoming: Sequence[ExpertKey]) -> None:
        raise NotImplementedError

    def _reads(self, il: int, hits: int, misses: Sequence[ExpertKey]) -> ReadPlan:
        raise NotImplementedError


class ExpertCache(_PolicyCache):
    """Cache on, with page moves: one buffer per (layer, projection) laid out like the file, an
    expert at its own place in it; see the module."""

    def __init__(
        self,
        layout: ModelLayout,
        budget_bytes: int,
        policy: PolicyFactory = DEFAULT_POLICY,
        pages: PageMover | None = None,
    ) -> None:
        super().__init__(layout, budget_bytes, policy)
        self.pages = pages
        self._buffers = _map_buffers({(t.il, t.proj): _buffer_size([t]) for t in layout.experts})
        self._slices_of = {
            il: tuple(
                _Slices.of(t.proj, self._buffers[(t.il, t.proj)], _pad(t), t.slice_nbytes, t.n_expert) for t in ts
            )
            for il, ts in self._tensors.items()
        }
        self._ops = _read_ops(self._tensors, self._buffer)
        self.moved_bytes = 0  # pages handed from a victim to an incoming expert (no release, no refault)

    def _buffer(self, t: ExpertTensor) -> TensorBuffer:
        return self._buffers[(t.il, t.proj)]

    def data_addr(self, t: ExpertTensor) -> int:
        return self._buffer(t).data_addr(t)

    def _reads(self, il: int, hits: int, misses: Sequence[ExpertKey]) -> ReadPlan:
        by_proj = self._ops[il]
        ops = tuple(by_expert[k.expert] for k in misses for _, by_expert in by_proj)
        projs = tuple(proj for _ in misses for proj, _ in by_proj)
        return ReadPlan(ops, hits, tuple(misses), projs)

    def _make_room(self, victims: Sequence[ExpertKey], incoming: Sequence[ExpertKey]) -> None:
        """Hand the victims' whole pages to the incoming experts, projection by projection (with a
        PageMover), then release what is left of the victims: their end pages, and all of any
        victim nobody took over. Nothing of ``victims`` or ``incoming`` may be in flight."""
        moved: set[tuple[ExpertKey, str]] = set()
        if self.pages is not None and victims and incoming:
            givers, takers = self._slices(victims), self._slices(incoming)
            for proj, gs in givers.items():
                for (vk, v), (ik, i) in zip(gs, takers.get(proj, ())):
                    vp, ip = v.pages[vk.expert], i.pages[ik.expert]
                    v_len, i_len = vp.i_hi - vp.i_lo, ip.i_hi - ip.i_lo
                    if v_len > 0 and i_len > 0:
                        self.pages.move(v.buf.window.addr + vp.i_lo, v_len, i.buf.window.addr + ip.i_lo, i_len)
                        self.moved_bytes += min(v_len, i_len)
                        self.released_bytes += max(0, v_len - i_len)  # a bigger victim's tail is cut off
                        moved.add((vk, proj))
        pending: dict[int, set[int]] = {}
        for key in victims:
            pending.setdefault(key.layer, set()).add(key.expert)
        for key in victims:  # one after another: a page shared with a victim not yet released is in use
            pending[key.layer].discard(key.expert)
            self._release(key, pending[key.layer], moved)

    def _slices(self, keys: Sequence[ExpertKey]) -> dict[str, list[tuple[ExpertKey, _Slices]]]:
        """Every (expert, slices) of ``keys`` by projection, biggest slice first, so that zipping
        two projections' lists pairs slices of like sizes."""
        out: dict[str, list[tuple[ExpertKey, _Slices]]] = {}
        for k in keys:
            for sl in self._slices_of[k.layer]:
                out.setdefault(sl.proj, []).append((k, sl))
        for pairs in out.values():
            pairs.sort(key=lambda kv: (-kv[1].size, kv[0].layer, kv[0].expert))
        return out

    def _release(self, key: ExpertKey, pending: set[int], moved: set[tuple[ExpertKey, str]]) -> None:
        """Release ``key``'s pages but those a resident neighbour, or a victim still ``pending``
        release (experts of ``key``'s layer), shares; of a slice whose whole pages were moved,
        only its end pages are left to release."""
        il, resident = key.layer, self.policy.is_resident

        def in_use(sharers: tuple[int, ...]) -> bool:
            return any(e in pending or resident(ExpertKey(il, e)) for e in sharers)

        for sl in self._slices_of[il]:
            pg = sl.pages[key.expert]
            lo = pg.lo + PAGE if pg.left and in_use(pg.left) else pg.lo
            hi = pg.hi - PAGE if pg.right and in_use(pg.right) else pg.hi
            if (key, sl.proj) in moved:  # its whole pages went to an incoming expert: the ends are left
                self.released_bytes += sl.buf.release(lo, pg.i_lo) + sl.buf.release(pg.i_hi, hi)
            else:
                self.released_bytes += sl.buf.release(lo, hi)


def _pool_of(t: ExpertTensor) -> tuple[str, int]:
    """The slot pool ``t``'s experts live in: one per (projection, slice bytes)."""
    return t.proj, t.slice_nbytes


def slots_refusal(layout: ModelLayout) -> str:
    """Why ``layout`` cannot run a SlotCache ("" where it can): the slots renumber the routed ids
    the expert matmuls read, so nothing else in the graph may gather by them."""
    if layout.expert_side:
        return (
            f"resident tensors indexed by expert ({', '.join(layout.expert_side[:3])}"
            + (", ..." if len(layout.expert_side) > 3 else "")
            + ") are gathered by the routed ids"
        )
    return ""


class SlotCache(_PolicyCache):
    """Cache on, with slots: the layers share one pool of slots per (projection, slice bytes), and
    the hook renumbers each route's expert ids to the slots its experts sit in, so an incoming
    expert is read straight into its victim's slot: no page is moved, released or faulted in.

    Slot ``k`` of a pool is ``[k * stride, (k + 1) * stride)`` with ``stride`` the slice rounded
    up to pages plus one page. A layer's tensor points at ``pool + pad`` (``pad``: its file offset
    modulo ALIGN, the same for every expert when the slice is whole pages), so the slice in slot
    ``k`` is at the file's offset modulo ALIGN and O_DIRECT reads it in place, the neighbouring file
    bytes it also writes staying inside the slot; a slice of another size goes through the reader's
    bounce buffer. The tensor's ``ne[2]`` is ``n_slots`` and its ``nb[2]`` the stride.

    Memory: a resident expert holds its slots' pages (at most one page per projection more than
    its bytes, which the budget counts); a free slot holds none (released at once). A victim's
    slot goes to an incoming expert at the same route; where the two layers' projections live in
    different pools (mixed quantization), the victim's pages in the pool the newcomer does not use
    are released. ``n_slots`` covers the budget plus two layers' experts (a wide route over
    budget, and a guess for the next layer), the most the policies ever hold at once."""

    def __init__(
        self, layout: ModelLayout, budget_bytes: int, policy: PolicyFactory = DEFAULT_POLICY, n_slots: int | None = None
    ) -> None:
        why = slots_refusal(layout)
        if why:
            raise ValueError(f"SlotCache: {why}")
        super().__init__(layout, budget_bytes, policy)
        most = len(layout.layers) * layout.n_expert
        smallest = min(layout.expert_nbytes_in_layer(il) for il in layout.layers)
        self.n_slots = n_slots if n_slots is not None else min(most, budget_bytes // smallest + 2 * layout.n_expert)
        if not 0 < self.n_slots <= most:
            raise ValueError(f"SlotCache: n_slots must be in 1..{most}, got {self.n_slots}")
        keys = sorted({_pool_of(t) for t in layout.experts})
        self.stride = {k: _round_up(k[1], PAGE) + PAGE for k in keys}
        self._buffers = _map_buffers({k: self.n_slots * self.stride[k] for k in keys})
        # per layer, per tensor (layout order): (tensor, its pool key); and the set of those pools
        self._pools = {il: tuple((t, _pool_of(t)) for t in ts) for il, ts in self._tensors.items()}
        self._pool_set = {il: frozenset(pool for _, pool in ps) for il, ps in self._pools.items()}
        self._slot: dict[ExpertKey, int] = {}
        self._free = list(range(self.n_slots))  # a heap: the lowest free slot first
        self._map = {il: np.full(layout.n_expert, -1, dtype=np.int32) for il in layout.layers}
        self.reused_bytes = 0  # slot bytes handed from a victim to an incoming expert
        self.high_water = 0  # most slots in use at once

    def data_addr(self, t: ExpertTensor) -> int:
        return self._buffers[_pool_of(t)].data_addr(t)

    def expert_stride(self, t: ExpertTensor) -> int:
        """The bytes between two slots of ``t``'s pool: its ggml ``nb[2]``."""
        return self.stride[_pool_of(t)]

    def slot_map(self, il: int) -> np.ndarray:
        """Layer ``il``'s slot of each expert (-1: none), int32 [n_expert]; live, do not write."""
        return self._map[il]

    def slot_of(self, key: ExpertKey) -> int | None:
        return self._slot.get(key)

    def _reads(self, il: int, hits: int, misses: Sequence[ExpertKey]) -> ReadPlan:
        ops, projs = [], []
        for key in misses:
            k = self._slot[key]
            for t, pool in self._pools[il]:
                ops.append(
                    ReadOp(
                        t.file_index,
                        t.slice_offset(key.expert),
                        t.slice_nbytes,
                        self._buffers[pool].window,
                        _pad(t) + k * self.stride[pool],
                    )
                )
                projs.append(t.proj)
        return ReadPlan(tuple(ops), hits, tuple(misses), tuple(projs))

    def _make_room(self, victims: Sequence[ExpertKey], incoming: Sequence[ExpertKey]) -> None:
        """Hand the victims' slots to the incoming experts; release the slots nobody took (and the
        pages of a taken slot in pools the newcomer's layer does not use). Nothing of ``victims``
        or ``incoming`` may be in flight."""
        freed = []
        for v in victims:
            freed.append((self._slot.pop(v), v.layer))
            self._map[v.layer][v.expert] = -1
        freed.reverse()  # pop() hands out the first victim's slot first
        for key in incoming:
            if freed:
                k, old = freed.pop()
                mine = self._pool_set[key.layer]
                for _, pool in self._pools[old]:
                    if pool in mine:
                        self.reused_bytes += self.stride[pool]
                    else:
                        self._release(pool, k)
            elif self._free:
                k = heapq.heappop(self._free)
            else:  # the policies never hold more than n_slots (see the class): a bug, not a user error
                raise RuntimeError(f"SlotCache: all {self.n_slots} slots are in use; cannot place {key}")
            self._slot[key] = k
            self._map[key.layer][key.expert] = k
        for k, old in freed:
            for _, pool in self._pools[old]:
                self._release(pool, k)
            heapq.heappush(self._free, k)
        self.high_water = max(self.high_water, len(self._slot))

    def _release(self, pool: tuple[str, int], k: int) -> None:
        stride = self.stride[pool]
        self.released_bytes += self._buffers[pool].release(k * stride, (k + 1) * stride)

    def close(self) -> None:
        super().close()
        self._slot.clear()
        self._free = list(range(self.n_slots))
        for m in self._map.values():
            m.fill(-1)
