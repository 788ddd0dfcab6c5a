"""Scoring whole choices: every choice's tokens after a base (the prompt in the sequence, or a
kept neutral prompt), each on its own forked copy of it, as many side by side as the backend has
side sequences; and the neutral prompt's side, kept per session.

A choice of ``k`` tokens needs the logits before each of them: the base's last row for the first,
then the rows after its first ``k - 1`` tokens, which one ``prefill_forks`` piece gives. A
one-token choice needs no prefill at all.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bmoe.decide.port import KeptState, PrefillCost, SequencePort
from bmoe.decide.scoring_modes import token_logps
from bmoe.numerics import log_softmax

UNCOND_STORED = "stored"  # the neutral prompt was prefilled and its state kept
UNCOND_RESTORED = "restored"  # the kept neutral state was forked for choices not seen after it yet
UNCOND_CACHED = "cached"  # every choice had been scored after this neutral prompt: nothing ran

TokenLogps = tuple[float, ...]


def continuation_logps(
    backend: SequencePort,
    first_row: np.ndarray,
    tokens: Sequence[Sequence[int]],
    n_past: int,
    base: KeptState | None = None,
) -> tuple[list[TokenLogps], list[PrefillCost]]:
    """Per-token log-probs of each token list after the base whose last logits are ``first_row``
    (``# [n_vocab]``): the sequence's ``n_past`` tokens, or the saved ``base``. The lists of more
    than one token are prefilled, all but their last token, at most ``max_forks()`` per call."""
    first_logp = log_softmax(first_row)
    # Only each choice's target log-probs are kept: a chunk's rows ([k - 1, n_vocab] a choice) are
    # reduced as soon as they come, so memory is one chunk's rows whatever the number of choices.
    out: list[TokenLogps | None] = [token_logps(first_logp, None, t) if len(t) <= 1 else None for t in tokens]
    costs: list[PrefillCost] = []
    longer = [i for i, t in enumerate(tokens) if len(t) > 1]
    cap = max(1, backend.max_forks())
    for at in range(0, len(longer), cap):
        chunk = longer[at : at + cap]
        got, cost = backend.prefill_forks([tokens[i][:-1] for i in chunk], n_past, base)
        if len(got) != len(chunk) or any(g.shape[0] != len(tokens[i]) - 1 for g, i in zip(got, chunk)):
            raise ValueError("prefill_forks returned rows that do not match the continuations")
        costs.append(cost)
        for i, g in zip(chunk, got):
            out[i] = token_logps(first_logp, log_softmax(g), tokens[i])  # g: [k - 1, n_vocab]
        del got
    return [o for o in out if o is not None], costs


@dataclass(frozen=True, slots=True)
class _KeptNeutral:
    tokens: tuple[int, ...]
    state: KeptState
    row: np.ndarray  # [n_vocab] logits after the neutral prompt


class NeutralStore:
    """The neutral prompt's side of a session: the latest neutral prompt's state and last logits
    (one prefill, then forked for every new choice), and the per-token log-probs of the choices
    already scored after a neutral prompt (up to ``max_choices``, oldest forgotten first)."""

    def __init__(self, max_choices: int = 4096) -> None:
        self._kept: _KeptNeutral | None = None
        self._memo: OrderedDict[tuple[tuple[int, ...], tuple[int, ...]], TokenLogps] = OrderedDict()
        self._max = max_choices

    @property
    def kept_mib(self) -> float:
        return 0.0 if self._kept is None else self._kept.state.mib

    def drop(self) -> None:
        self._kept = None
        self._memo.clear()

    def logps(
        self, backend: SequencePort, neutral: tuple[int, ...], tokens: Sequence[tuple[int, ...]]
    ) -> tuple[list[TokenLogps], list[PrefillCost], str]:
        """Each choice's per-token log-probs after ``neutral``, and what it cost and how: the
        choices seen before come from the memo; the others are forked from the kept neutral
        state, which is prefilled first when it is not this neutral prompt's."""
        known = [self._memo.get((neutral, t)) for t in tokens]
        missing = [i for i, k in enumerate(known) if k is None]
        if not missing:
            for t in tokens:
                self._memo.move_to_end((neutral, t))
            return [k for k in known if k is not None], [], UNCOND_CACHED
        costs: list[PrefillCost] = []
        kept = self._kept
        how = UNCOND_RESTORED
        if kept is None or kept.tokens != neutral:
            self._kept = None  # not this prompt's: freed before the new one is made
            row, state, cost = backend.prefill_apart(neutral)
            if state.n_tokens != len(neutral):
                raise ValueError(f"prefill_apart kept a state of {state.n_tokens} tokens for {len(neutral)}")
            kept = self._kept = _KeptNeutral(tokens=neutral, state=state, row=row)
            costs.append(cost)
            how = UNCOND_STORED
        got, more = continuation_logps(backend, kept.row, [tokens[i] for i in missing], len(neutral), kept.state)
        costs.extend(more)
        out = list(known)
        for i, g in zip(missing, got):
            out[i] = g
            self._memo[(neutral, tokens[i])] = g
            while len(self._memo) > self._max:
                self._memo.popitem(last=False)
        return [o for o in out if o is not None], costs, how
