"""Which routed experts the cache keeps: the policies' bookkeeping, on (layer, expert, bytes) alone.

A policy knows keys and sizes, never buffers or files: ``ExpertCache`` (cache.py) asks it at each
route which experts hit, which miss and which resident ones make room, and releases the evicted
experts' pages itself. ``bench/cache_replay.py`` drives the same classes over a recorded route
trace, without a model. The protocol, for a route of layer ``il``:

- ``plan(il, experts, uses)`` counts the hits, picks the victims that make room for the misses
  (never an expert of this route) and forgets them; returns ``(hits, misses, victims)``.
- ``admit(il, misses)`` records the misses as resident once their reads succeeded.
- ``reserve(il, experts, busy)`` (read-ahead, ``--prefetch``): makes room for the guessed experts
  that are not resident and records them as resident at once (their reads are queued next),
  counting no hit and no miss and leaving the routing statistics alone; returns ``(missing,
  victims)``. ``busy``: keys no victim may be, although they are resident: a route of another
  layer whose matmuls have not run yet (read-ahead two layers deep), or an earlier guess for the
  same layer whose reads are in flight. The route that follows passes the guessed experts as
  ``prefetched`` (resident, but a miss: they came from flash) and any guessed expert it did not
  pick as ``pinned`` (its read may still be in flight, so it must not be evicted by that route).

The budget is a hard cap on the bytes held: after ``plan`` the resident bytes plus the misses'
bytes are within it, unless this route's own experts alone do not fit (a wide prefill ubatch);
then everything else is evicted and the cache runs over budget by this route until the next plan.

- ``NextUsePolicy`` (the default): evict the expert whose next use is expected farthest away,
  from its layer's place in the layer cycle, how recently it was routed and how often (see
  docs/streaming.md, "The cache policy").
- ``LruPolicy``: one global LRU over (layer, expert), the policy before it; kept as the baseline.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Collection, Mapping, Protocol, Sequence

_NOTHING: frozenset[int] = frozenset()  # a layer's list that holds no expert back


@dataclass(frozen=True, slots=True, order=True)
class ExpertKey:
    layer: int
    expert: int


@dataclass(frozen=True, slots=True)
class Uses:
    """How the tokens of a route's ubatch used its experts (same order as the route's experts):
    ``counts[i]`` tokens picked expert i, the last of them at row ``last[i]`` (0-based) of the
    ``n_tokens`` rows. A decode route is one token: ``Uses.single(n)``."""

    n_tokens: int
    counts: Sequence[int]
    last: Sequence[int]

    @staticmethod
    def single(n_experts: int) -> "Uses":
        return Uses(1, (1,) * n_experts, (0,) * n_experts)


class CachePolicy(Protocol):
    budget_bytes: int
    resident_bytes: int
    hits: int
    misses: int
    evictions: int

    def plan(
        self,
        il: int,
        experts: Sequence[int],
        uses: Uses | None = None,
        *,
        prefetched: Collection[int] = (),
        pinned: Collection[int] = (),
    ) -> tuple[int, list[ExpertKey], list[ExpertKey]]: ...

    def admit(self, il: int, misses: Sequence[ExpertKey]) -> None: ...

    def reserve(
        self, il: int, experts: Sequence[int], busy: Collection[ExpertKey] = ()
    ) -> tuple[list[ExpertKey], list[ExpertKey]]: ...

    def is_resident(self, key: ExpertKey) -> bool: ...

    def clear(self) -> None: ...


class _Sizes:
    """Shared by the policies: per-layer expert bytes, the budget, the counters."""

    def __init__(self, expert_bytes: Mapping[int, int], budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError("a cache policy needs a positive budget; use SharedBuffers for cache off")
        if not expert_bytes or min(expert_bytes.values()) <= 0:
            raise ValueError("a cache policy needs every layer's expert bytes (all positive)")
        self.expert_bytes = dict(expert_bytes)
        self.budget_bytes = budget_bytes
        self.resident_bytes = self.hits = self.misses = self.evictions = 0


class LruPolicy(_Sizes):
    """One global LRU over (layer, expert) under the byte budget (bmoe's policy until 2026-11-30)."""

    def __init__(self, expert_bytes: Mapping[int, int], budget_bytes: int) -> None:
        super().__init__(expert_bytes, budget_bytes)
        self._lru: OrderedDict[ExpertKey, int] = OrderedDict()  # oldest first; value = bytes

    def is_resident(self, key: ExpertKey) -> bool:
        return key in self._lru

    def plan(
        self,
        il: int,
        experts: Sequence[int],
        uses: Uses | None = None,
        *,
        prefetched: Collection[int] = (),
        pinned: Collection[int] = (),
    ) -> tuple[int, list[ExpertKey], list[ExpertKey]]:
        route = {ExpertKey(il, e) for e in experts}
        misses: list[ExpertKey] = []
        hits = 0
        for key in sorted(route):
            if key in self._lru:
                self._lru.move_to_end(key)
                if key.expert in prefetched:
                    self.misses += 1
                else:
                    hits += 1
            else:
                misses.append(key)
        victims = self._evict(
            route | {ExpertKey(il, e) for e in pinned}, self.budget_bytes - len(misses) * self.expert_bytes[il]
        )
        self.hits += hits
        return hits, misses, victims

    def reserve(
        self, il: int, experts: Sequence[int], busy: Collection[ExpertKey] = ()
    ) -> tuple[list[ExpertKey], list[ExpertKey]]:
        keys = {ExpertKey(il, e) for e in experts}
        missing = sorted(k for k in keys if k not in self._lru)
        victims = self._evict(keys | set(busy), self.budget_bytes - len(missing) * self.expert_bytes[il])
        for key in missing:  # the oldest end: a guess is not a use
            self._lru[key] = self.expert_bytes[il]
            self._lru.move_to_end(key, last=False)
            self.resident_bytes += self.expert_bytes[il]
        return missing, victims

    def _evict(self, keep: set[ExpertKey], target: int) -> list[ExpertKey]:
        victims: list[ExpertKey] = []
        if self.resident_bytes > target:
            for key in list(self._lru):
                if self.resident_bytes <= target:
                    break
                if key not in keep:
                    self.resident_bytes -= self._lru.pop(key)
                    victims.append(key)
        self.evictions += len(victims)
        return victims

    def admit(self, il: int, misses: Sequence[ExpertKey]) -> None:
        for key in misses:
            self._lru[key] = self.expert_bytes[key.layer]
            self.resident_bytes += self.expert_bytes[key.layer]
        self.misses += len(misses)

    def clear(self) -> None:
        self._lru.clear()
        self.resident_bytes = 0


class NextUsePolicy(_Sizes):
    """Evict the resident expert whose next use is expected farthest away.

    Layers are routed in a cycle (0, 1, ..., L-1, then the next ubatch), so an expert of layer j
    can next be used in ``d_j`` routes (1 for the next layer, L for the layer just routed), then
    once per cycle. If it is picked at each of its layer's visits with probability ``q``, its
    next use is expected ``d_j + L * (1/q - 1)`` routes away; the victim is the resident expert
    with the largest such distance, weighted by its bytes (a bigger expert costs more room for
    the same hope). Plain LRU is the opposite across layers: the least recently used layer is
    the soonest visited again, which is why it gets 0 hits below one token cycle.

    ``q`` is estimated per (layer, expert) from two things the routes show:

    - recency: ``recency / lag ** recency_power``, where ``lag`` is the number of its layer's
      visits since it was last picked (1: by the previous token). In a wide ubatch the lag counts
      its tokens, so the experts of the ubatch's last tokens are the recent ones.
    - frequency: ``frequency * f``, with ``f`` a moving average (rate ``decay`` per visit of its
      layer) of the share of the route's tokens that picked it. A prefill ubatch is one visit,
      so an expert one token of a wide ubatch picked gains a small share, not a full use: a wide
      ubatch cannot pass for a hot set (scan resistance).

    Each layer keeps its resident experts sorted, worst victim last, and re-sorts them only when
    a route or guess must evict and the layer changed since its last sort (it was routed, or
    experts came in) or holds other experts back now: a route that evicts nothing (every expert
    cached, a budget not yet full) sorts nothing. An eviction then scans the layers.
    """

    def __init__(
        self,
        expert_bytes: Mapping[int, int],
        budget_bytes: int,
        *,
        recency: float = 0.15,
        recency_power: float = 1.0,
        frequency: float = 0.7,
        decay: float = 0.05,
    ) -> None:
        super().__init__(expert_bytes, budget_bytes)
        if not (recency >= 0 and recency_power > 0 and frequency >= 0 and 0 < decay <= 1 and recency + frequency > 0):
            raise ValueError("NextUsePolicy: recency, frequency >= 0 (not both 0), recency_power > 0, 0 < decay <= 1")
        self.recency, self.recency_power, self.frequency, self.decay = recency, recency_power, frequency, decay
        self._layers = tuple(sorted(self.expert_bytes))
        self._pos = {il: i for i, il in enumerate(self._layers)}
        self._n = len(self._layers)
        mean = sum(self.expert_bytes.values()) / self._n
        self._weight = {il: b / mean for il, b in self.expert_bytes.items()}
        self._clock = dict.fromkeys(self._layers, 0)  # visits (routes) of each layer so far
        # per layer: expert -> [f, visit f was last updated at, visit it was last picked at]
        self._stats: dict[int, dict[int, list[float]]] = {il: {} for il in self._layers}
        self._resident: dict[int, set[int]] = {il: set() for il in self._layers}
        # per layer: resident experts that may be evicted, best victim last, and that victim's
        # L * (1/q - 1) (None: not computed); rebuilt only when an eviction needs them (_refresh)
        self._cands: dict[int, list[int]] = {il: [] for il in self._layers}
        self._far: dict[int, float | None] = dict.fromkeys(self._layers)
        self._held: dict[int, frozenset[int]] = dict.fromkeys(self._layers, _NOTHING)  # what each list leaves out
        self._dirty: set[int] = set(self._layers)  # layers routed, or given experts, since their list was sorted

    def is_resident(self, key: ExpertKey) -> bool:
        return key.expert in self._resident.get(key.layer, ())

    def q(self, il: int, expert: int) -> float:
        """The estimated chance that ``expert`` is picked at layer ``il``'s next visit."""
        f, at, last = self._stats[il][expert]
        t = self._clock[il]
        q = self.recency / (t + 1 - last) ** self.recency_power + self.frequency * f * (1 - self.decay) ** (t - at)
        return min(1.0, max(q, 1e-9))

    def plan(
        self,
        il: int,
        experts: Sequence[int],
        uses: Uses | None = None,
        *,
        prefetched: Collection[int] = (),
        pinned: Collection[int] = (),
    ) -> tuple[int, list[ExpertKey], list[ExpertKey]]:
        if il not in self._clock:
            raise KeyError(f"layer {il} has no expert bytes in this policy")
        if len(set(experts)) != len(experts):
            raise ValueError(f"route of layer {il}: experts must be distinct, got {list(experts)}")
        uses = uses or Uses.single(len(experts))
        n = max(1, uses.n_tokens)
        t = self._clock[il] = self._clock[il] + 1
        stats, keep = self._stats[il], 1 - self.decay
        for e, c, row in zip(experts, uses.counts, uses.last, strict=True):
            picked = t - (n - 1 - row)  # in a wide ubatch, the visit of its last token counts
            s = stats.get(e)
            if s is None:
                stats[e] = [self.decay * c / n, t, picked]
            else:
                s[0] = s[0] * keep ** (t - s[1]) + self.decay * c / n
                s[1] = t
                s[2] = max(s[2], picked)
        resident = self._resident[il]
        ahead = sum(1 for e in experts if e in prefetched and e in resident)
        hits = sum(1 for e in experts if e in resident) - ahead
        misses = [ExpertKey(il, e) for e in sorted(experts) if e not in resident]
        self._dirty.add(il)  # its experts' odds moved
        victims = self._evict(il, self.budget_bytes - len(misses) * self.expert_bytes[il], {il: [*experts, *pinned]})
        self.hits += hits
        self.misses += ahead
        self.evictions += len(victims)
        return hits, misses, victims

    def reserve(
        self, il: int, experts: Sequence[int], busy: Collection[ExpertKey] = ()
    ) -> tuple[list[ExpertKey], list[ExpertKey]]:
        if il not in self._clock:
            raise KeyError(f"layer {il} has no expert bytes in this policy")
        held: dict[int, list[int]] = {}
        for k in busy:
            held.setdefault(k.layer, []).append(k.expert)
        held.setdefault(il, []).extend(experts)
        resident, stats, t = self._resident[il], self._stats[il], self._clock[il]
        missing = [ExpertKey(il, e) for e in sorted(set(experts)) if e not in resident]
        for key in missing:  # never routed yet: as if picked once, a visit ago, by no token's share
            stats.setdefault(key.expert, [0.0, t, t - 1])
        # Layer il's route is next: its resident experts the guess left out are one route away
        # (its route may still pick them), not a whole cycle as after a route of il.
        victims = self._evict(il, self.budget_bytes - len(missing) * self.expert_bytes[il], held, ahead=True)
        for key in missing:
            resident.add(key.expert)
        if missing:
            self._dirty.add(il)
        self.resident_bytes += len(missing) * self.expert_bytes[il]
        self.evictions += len(victims)
        return missing, victims

    def admit(self, il: int, misses: Sequence[ExpertKey]) -> None:
        for key in misses:
            self._resident[key.layer].add(key.expert)
            self.resident_bytes += self.expert_bytes[key.layer]
        self.misses += len(misses)
        self._dirty.update(key.layer for key in misses)

    def clear(self) -> None:
        for il in self._layers:
            self._resident[il].clear()
            self._cands[il] = []
            self._far[il] = None
        self.resident_bytes = 0
        self._dirty = set(self._layers)

    def _refresh(self, held: Mapping[int, Collection[int]]) -> None:
        """Make every layer's list the resident experts it may give up now, worst last: all but
        ``held[j]``. A list is sorted again only if its layer changed since, or holds back other
        experts: a layer's odds move only at its own routes, so a list sorted earlier is in the
        order a sort now would give."""
        for j in self._layers:
            pin = frozenset(held[j]) if j in held else _NOTHING
            if j in self._dirty or self._held[j] != pin:
                self._rebuild(j, pin)
        self._dirty.clear()

    def _rebuild(self, il: int, pin: frozenset[int]) -> None:
        stats = self._stats[il]
        self._cands[il] = sorted(
            (e for e in self._resident[il] if e not in pin), key=lambda e: (self.q(il, e), stats[e][2], e), reverse=True
        )
        self._held[il] = pin
        self._far[il] = None

    def _evict(
        self, il: int, target: int, held: Mapping[int, Collection[int]], *, ahead: bool = False
    ) -> list[ExpertKey]:
        """Evict the worst victims, none of ``held`` (per layer), until ``target`` bytes are held.
        Distances count from layer ``il``'s route (``ahead``: from the route just before it)."""
        victims: list[ExpertKey] = []
        if self.resident_bytes <= target:
            return victims
        self._refresh(held)
        here = self._pos[il] - 1 if ahead else self._pos[il]
        while self.resident_bytes > target:
            best, worst = None, -1.0
            for j in self._layers:
                cands = self._cands[j]
                if not cands:
                    continue
                far = self._far[j]
                if far is None:
                    far = self._far[j] = self._n * (1 / self.q(j, cands[-1]) - 1)
                d = (self._pos[j] - here) % self._n or self._n
                score = (d + far) * self._weight[j]
                if score > worst:
                    best, worst = j, score
            if best is None:  # only this route's experts are left: it runs over budget
                break
            e = self._cands[best].pop()
            self._far[best] = None
            self._resident[best].discard(e)
            self.resident_bytes -= self.expert_bytes[best]
            victims.append(ExpertKey(best, e))
        return victims


PolicyFactory = Callable[[Mapping[int, int], int], CachePolicy]
DEFAULT_POLICY: PolicyFactory = NextUsePolicy  # what every cache-on streamer runs (and bench/cache_replay.py)
# The --cache-policy names (SessionConfig.cache_policy takes these keys): the default, and plain
# global LRU, the baseline the benchmarks compare it with.
POLICIES: dict[str, PolicyFactory] = {"next-use": DEFAULT_POLICY, "lru": LruPolicy}
DEFAULT_POLICY_NAME = "next-use"
