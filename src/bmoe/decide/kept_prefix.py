"""The kept prefix state, and whether a session keeps one at all.

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
from bmoe.numerics import common_prefix_len

__all__ = ["KeptPrefix", "LastPrefixStore", "Lookup", "PrefixStore", "resolve_keep_prefix"]


@dataclass(frozen=True, slots=True)
class Lookup:
    """What the cache holds for a new prefix.

    ``kept`` is set on a hit (its tokens are the new prefix or a prefix of it); on a miss
    ``differs_at`` is the first token index where the kept prefix and the new one disagree
    (the new prefix may also simply end there). Both are None when nothing is kept.
    """

    kept: KeptPrefix | None = None
    differs_at: int | None = None


class PrefixStore(Protocol):
    def lookup(self, prefix_tokens: Sequence[int]) -> Lookup:
        """The kept state usable for ``prefix_tokens``, or why there is none."""
        ...

    def store(self, prefix_tokens: Sequence[int], state: KeptState) -> None:
        """Keep ``state``, taken right after ``prefix_tokens``."""
        ...

    def drop(self) -> None:
        """Free the kept state (a generate() does this)."""
        ...

    @property
    def kept(self) -> KeptPrefix | None:
        """The state kept now, which the decider passes down to the sequence (``SequencePort.keep``)."""
        ...


class LastPrefixStore:
    """Keeps one state: the latest prefix stored. Storing replaces it."""

    def __init__(self) -> None:
        self._kept: KeptPrefix | None = None

    def lookup(self, prefix_tokens: Sequence[int]) -> Lookup:
        kept = self._kept
        if kept is None:
            return Lookup()
        n_common = common_prefix_len(kept.tokens, prefix_tokens)
        if n_common == len(kept.tokens):
            return Lookup(kept=kept)
        return Lookup(differs_at=n_common)

    def store(self, prefix_tokens: Sequence[int], state: KeptState) -> None:
        tokens = tuple(prefix_tokens)
        if state.n_tokens != len(tokens):
            # A state that does not describe these tokens would later be restored as if it did.
            raise ValueError(
                f"prefix cache: a saved state of {state.n_tokens} tokens cannot be kept for a "
                f"{len(tokens)}-token prefix"
            )
        self._kept = KeptPrefix(tokens=tokens, state=state)

    def drop(self) -> None:
        self._kept = None

    @property
    def kept(self) -> KeptPrefix | None:
        return self._kept


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
