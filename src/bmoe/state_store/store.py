"""The store of kept sequence states: a RAM tier within a byte budget over an optional flash tier.

Lookup: the longest kept state whose tokens are a prefix of the prompt's prefix, in either tier
(RAM first on a tie). A state read from flash comes back into RAM (and stays on flash).

Eviction is LRU (least recently stored or restored first), the documented baseline, with one rule
before it: a state that a longer state in RAM extends (an agent's earlier step, once its next step
is kept) leaves first, least recently used first among those; the most recent state never does by
that rule. A replay of agent traffic measured it against plain LRU and against a cost-aware order
(recompute seconds against bytes), tests/state_store/test_eviction_replay.py. A state that
leaves RAM goes to the flash tier if it is on. A state that still lives only in the sequence (a
backend's handle with ``copy`` None, ``len(data) == 0``: attention-only models) has no bytes to
write yet: it waits in ``_pending`` and stays in ``held``, so the backend copies it out before the
sequence loses it, and is written at the store's next call. The flash tier evicts its own files
LRU within its budget. ``max_states`` bounds the RAM tier by count too:
``StateStore.last_prefix()`` (one state, no flash) is what a session keeps by default, the
latest prefix only.

A budget of 0 turns that tier off, not the store: with the RAM tier off and the flash tier on,
every state stored goes to flash (the one living in the sequence once it is copied out). With both
off nothing is kept.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bmoe.decide.kept_prefix import TIER_DISK, TIER_RAM, Lookup
from bmoe.decide.port import KeptPrefix, KeptState
from bmoe.state_store.disk import DiskTier
from bmoe.state_store.trie import TokenTrie

# States waiting for their copy to reach flash, at most: each one lives in the sequence, which
# copies them out longest first before it loses them; one that it never copies is dropped here.
MAX_PENDING = 8


def _payload(state: KeptState) -> np.ndarray | bytes | None:
    """A state's bytes: itself, or a backend handle's copy once made; None while it has none."""
    data = state.data
    if isinstance(data, (np.ndarray, bytes)):
        return data
    copy = getattr(data, "copy", None)
    return copy if isinstance(copy, (np.ndarray, bytes)) else None


@dataclass(frozen=True, slots=True)
class StoreCounts:
    """The store's counters since it opened (``/metrics``): lookups that found a state in RAM or
    on flash, lookups that found none; per tier, lookups it did not answer (``misses_ram``: every
    lookup not answered from RAM; ``misses_disk``: lookups that RAM did not answer and the flash
    tier, on, did not either); bytes held per tier now, states evicted per tier (left RAM; files
    deleted for room), files found bad and deleted."""

    hits_ram: int
    hits_disk: int
    misses: int
    misses_ram: int
    misses_disk: int
    bytes_ram: int
    bytes_disk: int
    states_ram: int
    states_disk: int
    evictions_ram: int
    evictions_disk: int
    corrupt_disk: int


class StateStore:
    """Kept prefix states in RAM (at most ``ram_budget`` bytes; None: unbounded, ``max_states``
    bounds it) over ``disk`` (None: no flash tier)."""

    def __init__(self, ram_budget: int | None, disk: DiskTier | None = None, max_states: int | None = None) -> None:
        if max_states is not None and max_states < 1:
            raise ValueError("state store: max_states must be at least 1")
        self.ram_budget, self.disk, self.max_states = ram_budget, disk, max_states
        self._ram: OrderedDict[tuple[int, ...], KeptPrefix] = OrderedDict()  # LRU first
        self._trie: TokenTrie[KeptPrefix] = TokenTrie()
        self._last: KeptPrefix | None = None
        # states that left RAM for flash while living only in the sequence, waiting for their copy
        self._pending: OrderedDict[tuple[int, ...], KeptPrefix] = OrderedDict()
        self.hits_ram = self.hits_disk = self.misses = self.evictions_ram = 0
        self.misses_ram = self.misses_disk = 0

    @classmethod
    def last_prefix(cls) -> StateStore:
        """The latest prefix only, in RAM: storing replaces it (a session's default)."""
        return cls(ram_budget=None, max_states=1)

    @property
    def ram_on(self) -> bool:
        return self.ram_budget != 0

    @property
    def disk_on(self) -> bool:
        return self.disk is not None and self.disk.on

    # --- the decider's side (decide.kept_prefix.PrefixStore) ---------------------------------
    def lookup(self, prefix_tokens: Sequence[int]) -> Lookup:
        self._fit()
        self._write_pending()
        tokens = tuple(prefix_tokens)
        n_ram, in_ram, depth = self._trie.longest(tokens)
        n_disk, depth_disk = 0, 0
        if self.disk_on:
            assert self.disk is not None
            self.disk.rescan()
            n_disk, _, depth_disk = self.disk.index.longest(tokens)
        if in_ram is not None and n_ram >= n_disk:
            self._ram.move_to_end(in_ram.tokens)
            self._last = in_ram
            self.hits_ram += 1
            return Lookup(kept=in_ram, tier=TIER_RAM)
        if n_disk > 0:
            found = self._from_disk(tokens[:n_disk])
            if found is not None:
                self.misses_ram += 1
                return found
            return self.lookup(prefix_tokens)  # the file was bad or gone: the next best, or none
        self.misses += 1
        self.misses_ram += 1
        self.misses_disk += self.disk_on
        depth = max(depth, depth_disk)
        kept_any = len(self._trie) > 0 or (self.disk_on and len(self.disk.index) > 0)  # type: ignore[union-attr]
        return Lookup(differs_at=depth if kept_any else None)

    def _from_disk(self, tokens: tuple[int, ...]) -> Lookup | None:
        assert self.disk is not None
        t0 = time.perf_counter()
        payload = self.disk.get(tokens)
        if payload is None:
            return None
        kept = KeptPrefix(tokens=tokens, state=KeptState(data=payload, n_tokens=len(tokens)))
        load_s = time.perf_counter() - t0
        self.hits_disk += 1
        if self.ram_on:
            self._put_ram(kept)
        self._last = kept
        return Lookup(kept=kept, tier=TIER_DISK, load_s=load_s)

    def store(self, prefix_tokens: Sequence[int], state: KeptState) -> None:
        tokens = tuple(prefix_tokens)
        if state.n_tokens != len(tokens):
            # A state that does not describe these tokens would later be restored as if it did.
            raise ValueError(
                f"prefix cache: a saved state of {state.n_tokens} tokens cannot be kept for a "
                f"{len(tokens)}-token prefix"
            )
        self._write_pending()
        kept = KeptPrefix(tokens=tokens, state=state)
        self._last = kept
        if self.ram_on:
            self._put_ram(kept)
        else:
            self._spill(kept)

    def make_room(self, prefix_tokens: Sequence[int]) -> None:
        if self.max_states is not None:
            while len(self._ram) >= self.max_states:
                self._evict_one()

    def drop(self) -> None:
        while self._ram:
            self._evict_one()
        self._write_pending()
        self._pending.clear()  # the sequence forgets them next: no copy will come
        self._last = None

    @property
    def lasting(self) -> bool:
        return self.max_states != 1

    @property
    def held(self) -> tuple[KeptPrefix, ...]:
        return tuple(self._ram.values()) + tuple(self._pending.values())

    @property
    def kept(self) -> KeptPrefix | None:
        last = self._last
        return last if last is not None and self._ram.get(last.tokens) is last else None

    # --- tiers --------------------------------------------------------------------------------
    @property
    def bytes_ram(self) -> int:
        return sum(k.state.nbytes for k in self._ram.values())

    def _put_ram(self, kept: KeptPrefix) -> None:
        old = self._ram.pop(kept.tokens, None)
        if old is not None:
            self._trie.remove(old.tokens)
        self._ram[kept.tokens] = kept
        self._trie.put(kept.tokens, kept)
        self._fit()

    def _fit(self) -> None:
        """Evict LRU states until the RAM tier is within its budget and count (sizes grow when a
        state that lived in the sequence is copied out). The newest state stays when it alone is
        over the budget: it is the one the next request most likely extends."""
        while len(self._ram) > 1 and (
            (self.max_states is not None and len(self._ram) > self.max_states)
            or (self.ram_budget is not None and self.bytes_ram > self.ram_budget)
        ):
            self._evict_one()

    def _victim(self) -> tuple[int, ...]:
        """The state to evict: the least recently used one that a longer state in RAM extends
        (not the most recent), else the least recently used."""
        keys = list(self._ram)
        return next((t for t in keys[:-1] if self._trie.extended(t)), keys[0])

    def _evict_one(self) -> None:
        kept = self._ram.pop(self._victim())
        self._trie.remove(kept.tokens)
        self.evictions_ram += 1
        self._spill(kept)

    def _spill(self, kept: KeptPrefix) -> None:
        if not self.disk_on or self.disk.index.get(kept.tokens) is not None:  # type: ignore[union-attr]
            return
        payload = _payload(kept.state)
        if payload is not None:
            self.disk.put(kept.tokens, payload)  # type: ignore[union-attr]
        elif getattr(kept.state.data, "copy", False) is None:  # lives in the sequence: wait for its copy
            self._pending[kept.tokens] = kept
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)

    def _write_pending(self) -> None:
        """Write the states that were waiting for their copy and have one now."""
        for tokens, kept in list(self._pending.items()):
            payload = _payload(kept.state)
            if payload is not None or not self.disk_on:
                del self._pending[tokens]
            if payload is not None and self.disk_on:
                self.disk.put(tokens, payload)  # type: ignore[union-attr]

    def flush(self) -> None:
        """Write the RAM tier's states to flash (at close: they survive a restart)."""
        self._write_pending()
        for kept in list(self._ram.values()):
            self._spill(kept)

    def counts(self) -> StoreCounts:
        disk = self.disk
        return StoreCounts(
            hits_ram=self.hits_ram,
            hits_disk=self.hits_disk,
            misses=self.misses,
            misses_ram=self.misses_ram,
            misses_disk=self.misses_disk,
            bytes_ram=self.bytes_ram,
            bytes_disk=disk.bytes_held if disk is not None else 0,
            states_ram=len(self._ram),
            states_disk=len(disk.index) if disk is not None else 0,
            evictions_ram=self.evictions_ram,
            evictions_disk=disk.evictions if disk is not None else 0,
            corrupt_disk=disk.corrupt if disk is not None else 0,
        )
