"""The two ports between the decide policy and the engine that runs the model (docs/decide.md).

``TextPort`` turns request text into token ids and holds no model state; ``SequencePort`` is one
context's sequence: prefill, logits, its state saved and loaded, and the side sequences it forks
into. The policy only ever sees token ids, logit rows and opaque saved states; the llama.cpp
adapters live in ``bmoe.runtime.decide``, and scripted fakes implement both ports in the tests.
Calls go one way, policy to engine: what the policy keeps is passed down (``SequencePort.keep``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bmoe.image_refs import ImageSource

BYTES_PER_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class PrefillCost:
    """What one ``prefill()`` call cost, counted over the call alone.

    ``read_mb`` is None when no experts are streamed (resident model); ``cache_hits`` and
    ``cache_misses`` (expert cache lookups) are None then and with the expert cache off;
    ``prefill_dev_tokens`` is None when no prefill device is configured. A request's
    ``cache_hit_pct`` is computed from the counts of its calls summed, as BMOE_DONE's is over its
    request. A batch member's share of a call may be a fraction of a count.
    """

    n_tokens: int
    prefill_s: float
    read_mb: float | None = None
    cache_hits: float | None = None
    cache_misses: float | None = None
    prefill_dev_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class KeptState:
    """A saved sequence state: the whole state (KV and recurrent layers) after ``n_tokens``.

    ``data`` is opaque to the policy; only the backend that saved it can load it. Its len() is
    what it holds in RAM: a backend may keep the state in the live sequence and copy it out only
    when the sequence is about to lose it, and until then it costs nothing beyond the context.
    """

    data: np.ndarray | bytes | Sized  # [nbytes] uint8, or a backend's handle; len() in bytes
    n_tokens: int

    @property
    def nbytes(self) -> int:
        return len(self.data)

    @property
    def mib(self) -> float:
        return len(self.data) / BYTES_PER_MIB


@dataclass(frozen=True, slots=True)
class KeptPrefix:
    """A prefix's tokens and the sequence state right after them: what the policy keeps."""

    tokens: tuple[int, ...]
    state: KeptState


SIDE_OFF = "off"  # the session was opened without side sequences (decide_batch 1)
SIDE_MEMORY = "memory"  # none fits in the memory the process may still allocate
SIDE_FAILED = "failed"  # opening them failed (``detail`` says how); the session went on without


@dataclass(frozen=True, slots=True)
class SideSequences:
    """The side sequences a backend has beside its main sequence, or can open.

    ``n_open``: open now. ``n_most``: the most it will have: ``n_open`` once open, else what
    ``open_side_sequences()`` would open now (0: none). When ``n_most`` is 0, ``why_none`` says
    why (``SIDE_OFF``, ``SIDE_MEMORY`` or ``SIDE_FAILED``); for ``SIDE_MEMORY`` ``kv_bytes`` is
    what one side sequence would take and ``room_bytes`` what they may take together (half of
    what the process may still allocate); for ``SIDE_FAILED`` ``detail`` is the failure."""

    n_open: int
    n_most: int
    why_none: str = ""
    kv_bytes: int = 0
    room_bytes: int = 0
    detail: str = ""


def is_image_token(token: int) -> bool:
    """Whether ``token`` is one position of an image (``PromptRenderer.tokenize_prompts``)."""
    return token < -1


class PromptRenderer(Protocol):
    """The part of the backend that turns request text into prompt tokens (no model state)."""

    def render_user(self, text: str, history: Sequence[tuple[str, str]] = ()) -> str:
        """The chat template over one user message ``text`` (after the ``history`` messages,
        (role, content) pairs), opening a fresh assistant turn, reasoning off; rendered by the
        same function generate() uses. Identity without a template and without history."""
        ...

    def tokenize_prompts(self, texts: Sequence[str], images: Sequence[ImageSource] = ()) -> list[list[int]]:
        """Tokens of each rendered prompt, in order, as the engine feeds them: specials parsed,
        BOS as the model wants it. A backend may tokenize them concurrently (a decision
        tokenizes its prompt twice, and at thousands of tokens that is most of its own cost).

        ``images`` (the request's: file paths, data: URLs or bytes) go at the image markers of each text
        in order: a text with k markers takes the first k. An image stands in the tokens as a run
        of equal ids below -1 (``is_image_token``), which the backend prefills whole: a piece
        given to ``prefill`` never starts or ends inside one. A bad image is a DecideRefusal."""
        ...


class ChoiceTokenizer(Protocol):
    """The part of the backend that turns choice labels into token ids (no model state)."""

    def tokenize_choice(self, text: str) -> list[int]:
        """Tokens of a choice on its own: no template, no BOS, no leading space added."""
        ...

    def token_piece(self, token: int) -> str:
        """The text of one token, for messages that name it."""
        ...


class TextPort(PromptRenderer, ChoiceTokenizer, Protocol):
    """Request text to token ids: the prompts rendered and tokenized, the choices tokenized."""


class SequencePort(Protocol):
    """One model context's sequence as decide drives it, and the side sequences it forks into.

    Side sequences (batches, full scoring) may be opened late: ``side_sequences`` says how many
    there will be before they are open, and ``open_side_sequences`` opens them, between decisions
    only (opening may cost the sequence its KV). ``max_batch`` and ``max_forks`` are what one call
    takes now, with the side sequences open now."""

    def n_ctx(self) -> int:
        """How many tokens the sequence can hold."""
        ...

    # --- the sequence ---------------------------------------------------------------------
    def clear(self) -> float:
        """Empty the sequence (position 0 next). Returns the seconds spent copying out a kept
        state that still lived in the sequence (see ``keep``), 0.0 when there was none."""
        ...

    def prefill(self, tokens: Sequence[int], n_past: int) -> PrefillCost:
        """Append ``tokens`` to the sequence at positions ``n_past ..``, as one prefill call
        (the backend splits it into ubatches as it always does); logits are needed after the
        last token only."""
        ...

    def last_logits(self) -> np.ndarray:
        """``float32 [n_vocab]``: the logits after the last prefilled token."""
        ...

    # --- its state ------------------------------------------------------------------------
    def save_state(self) -> KeptState:
        """The whole sequence state as it stands now, loadable by ``load_state`` after the
        sequence has moved on (a copy, or a promise to copy it before the sequence loses it while
        it is kept: ``keep``)."""
        ...

    def load_state(self, state: KeptState) -> None:
        """Replace the whole sequence with ``state`` (a ``save_state`` of this backend, kept);
        the next position is ``state.n_tokens``."""
        ...

    def keep(self, kept: Sequence[KeptPrefix]) -> None:
        """The saved states the caller keeps now, each with the tokens it holds; it calls this
        whenever that changes. A state that lives in the sequence is copied out before the sequence
        loses it only while it is kept, and no copy goes into a buffer a kept state is in. A state
        no longer kept may not be loaded again."""
        ...

    def forget(self) -> None:
        """Keep nothing (``keep(())``) and give the buffers held for kept states back to the OS."""
        ...

    @property
    def held_bytes(self) -> int:
        """Bytes of RAM the backend holds beyond the context for kept states: their copies and any
        buffer kept ready for the next one; 0 while a state lives only in the sequence."""
        ...

    # --- side sequences -------------------------------------------------------------------
    def side_sequences(self) -> SideSequences:
        """The side sequences open now, the most there will be, and why none where none will be
        (full scoring is refused where ``n_most`` is 0)."""
        ...

    def open_side_sequences(self) -> int:
        """Open the side sequences now, if they are not open yet and some can be; returns how many
        are open afterwards (0: none; ``side_sequences().why_none`` says why). ``prefill_batch``,
        ``prefill_forks`` and ``prefill_apart`` need them open.

        Opening may re-create the model context: the sequence is then emptied (its KV is lost;
        next position 0), so the caller drops its kept states first (``forget``) and calls this
        only between decisions, never between a decision's prefix and its rest. Once open they
        stay open; a call then changes nothing."""
        ...

    def max_batch(self) -> int:
        """How many suffixes one ``prefill_batch`` call takes at most; 1 when the backend cannot
        prefill several together, or has no side sequence open (then decisions are answered one
        by one)."""
        ...

    def prefill_batch(
        self, suffixes: Sequence[Sequence[int]], n_past: int, stop: Callable[[], bool] = ...
    ) -> tuple[list[np.ndarray], PrefillCost]:
        """Prefill each of ``suffixes`` after the ``n_past`` tokens the sequence holds, each as if
        it were the only one: every suffix continues its own copy of the sequence, in one piece.
        Returns ``float32 [n_vocab]`` logits after each suffix's last token, in order, and what the
        whole call cost (its ``n_tokens``: the suffixes' tokens). The sequence itself is left
        holding its ``n_past`` tokens, unchanged. Where the backend needs several calls of the
        model, it asks ``stop()`` before each and raises ``DecideCancelled`` when it says so."""
        ...

    def max_forks(self) -> int:
        """How many continuations one ``prefill_forks`` call takes at most: the side sequences open
        now, which the backend forks the sequence into; 0 when none are open."""
        ...

    def prefill_forks(
        self, continuations: Sequence[Sequence[int]], n_past: int, base: KeptState | None = None
    ) -> tuple[list[np.ndarray], PrefillCost]:
        """Prefill each of ``continuations`` on its own copy of a base: the ``n_past`` tokens the
        sequence holds (``base`` None), or the saved state ``base`` (from ``prefill_apart``; then
        ``n_past`` is its ``n_tokens``). Each continuation goes in as one piece, as it would alone
        (where the backend packs several into one call, it pads them so that they still are).
        Returns ``float32 [len(c), n_vocab]`` per continuation: the logits after each of its tokens,
        and what the whole call cost. The sequence itself is left unchanged."""
        ...

    def prefill_apart(self, tokens: Sequence[int]) -> tuple[np.ndarray, KeptState, PrefillCost]:
        """Prefill ``tokens`` from position 0 apart from the sequence (which is left unchanged):
        returns the ``float32 [n_vocab]`` logits after the last one, the state after them as a
        copy that ``prefill_forks`` takes as its ``base``, and what it cost."""
        ...
