"""The up-front choice checks and the scoring of one logit row.

A choice is scored by its first token, read from the next-token distribution over the whole
vocabulary. Everything that would make that reading meaningless is refused here, before the
backend prefills anything.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bmoe.decide.errors import (
    ChoiceCollisionError,
    EmptyChoiceError,
    EmptyPromptError,
    NoChoicesError,
    PromptTooLongError,
)
from bmoe.decide.port import ChoiceTokenizer
from bmoe.decide.types import ChoiceScores
from bmoe.numerics import log_softmax


def tokenize_choices(tokenizer: ChoiceTokenizer, choices: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """Each choice's tokens, refusing an empty list and a choice with no tokens."""
    if not choices:
        raise NoChoicesError("decide: choices is empty; give at least one choice, e.g. [\"A\",\"B\"]")
    out: list[tuple[int, ...]] = []
    for i, choice in enumerate(choices):
        tokens = tuple(tokenizer.tokenize_choice(choice))
        if not tokens:
            raise EmptyChoiceError(f"decide: choice {i} ({choice!r}) tokenizes to no tokens; give it a non-empty label")
        out.append(tokens)
    return tuple(out)


def first_tokens(tokenizer: ChoiceTokenizer, choices: Sequence[str]) -> tuple[int, ...]:
    """Each choice's first token, refusing an empty list, an empty choice and a collision."""
    firsts: list[int] = []
    owner: dict[int, int] = {}  # first token -> index of the choice that has it
    for i, tokens in enumerate(tokenize_choices(tokenizer, choices)):
        first = tokens[0]
        if first in owner:
            j = owner[first]
            raise ChoiceCollisionError(
                f"decide: choices {j} ({choices[j]!r}) and {i} ({choices[i]!r}) both start with token "
                f"{first} ({tokenizer.token_piece(first)!r}); a choice is scored by its first "
                f"token, so they cannot be told apart: give labels that start differently (A, B, C, ...)"
            )
        owner[first] = i
        firsts.append(first)
    return tuple(firsts)


def check_prompt_fits(n_tokens: int, n_ctx: int, n_image_tokens: int = 0) -> None:
    """Refuse a prompt with no tokens or more tokens than the context holds (``n_image_tokens``
    of them its images')."""
    if n_tokens == 0:
        raise EmptyPromptError("decide: the prompt renders to no tokens; give a prefix or a suffix")
    if n_tokens > n_ctx:
        if n_image_tokens:
            raise PromptTooLongError(
                f"decide: the prompt is {n_tokens} tokens, {n_image_tokens} of them its images', but the context "
                f"holds {n_ctx}; give smaller images or fewer, or open the session with a larger context"
            )
        raise PromptTooLongError(
            f"decide: the prompt is {n_tokens} tokens but the context holds {n_ctx}; "
            f"shorten the prefix or suffix, or open the session with a larger context"
        )


def score_choices(logits: np.ndarray, first: Sequence[int], abstain_below: float | None) -> ChoiceScores:
    """Read the choices' first-token log-probabilities from one logit row.

    ``logits  # [n_vocab]``. The probabilities are normalised over the whole vocabulary, not over
    the choices, so the mass left outside them says how unsure the model is.
    """
    logp = log_softmax(logits)  # [n_vocab], float64
    idx = np.asarray(first, dtype=np.int64)
    choice_logp = logp[idx]  # [n_choices]
    best = int(np.argmax(choice_logp))
    p_outside = mass_outside(logp, idx)
    abstained = abstain_below is not None and float(np.exp(choice_logp[best])) < abstain_below
    return ChoiceScores(
        choice_logp=tuple(float(x) for x in choice_logp),
        best=-1 if abstained else best,
        p_outside=p_outside,
        abstained=abstained,
    )


def mass_outside(logp: np.ndarray, tokens: np.ndarray) -> float:
    """Probability of every token but ``tokens``, from one log-softmax row ``# [n_vocab]``.

    Summing the other tokens (rather than 1 - sum over the choices) keeps a tiny outside mass
    exact instead of losing it to cancellation, and it can never come out negative."""
    outside = np.ones(logp.shape[-1], dtype=bool)
    outside[tokens] = False
    return float(np.sum(np.exp(logp[outside])))
