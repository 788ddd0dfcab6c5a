"""The kept prefix states as the decider sees them (the store is ``bmoe.state_store``), and
whether a session keeps any at all.

An agent's prompt grows step by step, so the state worth keeping is the latest prefix: the next
request's prefix is the same or extends it. The state is the whole sequence state (recurrent
layers included), which is why a kept state can only be extended, never trimmed back: a hybrid
model's recurrent memory has no "state at token k" once it has gone past k.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from bmoe.decide.port import KeptPrefix, KeptState

__all__ = ["TIER_DISK", "TIER_RAM", "KeptPrefix", "Lookup", "PrefixStore", "resolve_keep_prefix"]


TIER_RAM = "ram"  # a kept state found in RAM
TIER_DISK = "disk"  # a kept state read back from flash


@dataclass(frozen=True, slots=True)
class Lookup:
    """What the store holds for a new prefix.

    ``kept`` is set on a hit (its tokens are the new prefix or a prefix of it), with ``tier`` where
    it was found (``TIER_RAM`` or ``TIER_DISK``) and ``load_s`` the seconds its tier took to hand it
    over (reading and checking a file; 0 from RAM). On a miss ``differs_at`` is the first token
    index where the new prefix parts from every kept one (the new prefix may also simply end there).
    Both are None when nothing is kept.
    """

    kept: KeptPrefix | None = None
    differs_at: int | None = None
    tier: str = ""
    load_s: float = 0.0


class PrefixStore(Protocol):
    """The kept prefix states as the decider uses them: ``bmoe.state_store.StateStore`` implements
    it (the session builds one and hands it in; decide does not import the store)."""

    def lookup(self, prefix_tokens: Sequence[int]) -> Lookup:
        """The longest kept state usable for ``prefix_tokens``, or why there is none."""
        ...

    def store(self, prefix_tokens: Sequence[int], state: KeptState) -> None:
        """Keep ``state``, taken right after ``prefix_tokens``."""
        ...

    def make_room(self, prefix_tokens: Sequence[int]) -> None:
        """A state for ``prefix_tokens`` is about to be computed and stored: drop now what storing
        it would evict anyway, so that nothing is copied out of the sequence only to be dropped."""
        ...

    def drop(self) -> None:
        """Free the states kept in RAM (a generate() does this); states on flash stay."""
        ...

    def flush(self) -> None:
        """Write the states kept in RAM to flash, where there is a flash tier (at close)."""
        ...

    @property
    def lasting(self) -> bool:
        """Whether the states outlast a generate() (``Decider.drop``): False for the latest-prefix
        store, whose one state is only worth its RAM between decisions."""
        ...

    @property
    def held(self) -> tuple[KeptPrefix, ...]:
        """The states kept in RAM now, which the decider passes down to the sequence
        (``SequencePort.keep``)."""
        ...

    @property
    def kept(self) -> KeptPrefix | None:
        """The state stored or restored last, if it is still kept."""
        ...


def resolve_keep_prefix(mode: str, *, prefill_device: bool) -> bool:
    """Whether a session keeps prefix states, for a valid ``SessionConfig.decide_prefix_cache``
    (``auto``, ``on`` or ``off``; the config checked it).

    ``auto`` keeps them for CPU prefill, where prefilling a prompt in two pieces costs about what
    the two pieces cost together. With a prefill device it resolves to off: there every graph pays
    the per-graph weight copy, so the few tokens after a restored prefix cost nearly a whole pass.
    ``on`` keeps them with a device too: bmoe's KV cache never leaves the host, so a restored state
    is exact there (gate G18g checks it; docs/prefill-device.md says why this differs from the
    C++ engine, whose saved states went stale on its device).
    """
    return mode == "on" or (mode == "auto" and not prefill_device)
