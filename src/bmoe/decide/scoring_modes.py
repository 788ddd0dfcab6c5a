"""Scoring modes: how a choice is scored ("first" token or "full"), which score picks ``best``,
and the up-front checks of those request fields.

Under ``"full"`` every token of a choice is scored after the prompt. From the per-token
log-probabilities this module derives what the answer reports per choice: the sum (lm-eval's
``acc``), the mean per token, the sum per character of the choice text (lm-eval's ``acc_norm``
divides by the length of the choice string) and, with a neutral prompt, the sum minus the same
choice's sum after the neutral prompt (lm-eval's ``acc_mutual_info``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bmoe.decide.choice_scorer import mass_outside
from bmoe.decide.errors import ChoiceTooLongError, DecideRequestError
from bmoe.decide.types import ChoiceScores, DecideRequest

SCORING_FIRST = "first"
SCORING_FULL = "full"
SCORING_MODES = (SCORING_FIRST, SCORING_FULL)


def norm_chars(choice: str) -> int:
    """What ``choice_logp_norm`` divides by: the choice's characters without its leading whitespace
    (at least 1). lm-evaluation-harness scores a continuation as its delimiter (a space by default)
    plus the choice, and its ``acc_norm`` divides by the choice alone: a choice sent as " Paris"
    counts 5 here as it does there."""
    return max(1, len(choice.lstrip()))


# best_by value -> the ChoiceScores field it ranks by
BEST_BY = {"sum": "choice_logp", "mean": "choice_logp_mean", "norm": "choice_logp_norm", "uncond": "choice_logp_uncond"}
# The neutral prompt when best_by is "uncond" and the request names none: an empty user message
# (lm-eval's unconditional log-likelihood, too, is the choice after an empty context).
DEFAULT_NEUTRAL = ""


def _quoted(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def check_scoring_fields(request: DecideRequest) -> None:
    """Refuse an unknown scoring or best_by, and the fields that only mean something under
    "full"."""
    if request.scoring not in SCORING_MODES:
        raise DecideRequestError(
            f'decide: "scoring" is {_quoted(request.scoring)}; give "first" (each choice by its first '
            f'token) or "full" (by all its tokens)',
            field="scoring",
        )
    if request.best_by not in BEST_BY:
        raise DecideRequestError(
            f'decide: "best_by" is {_quoted(request.best_by)}; give one of {", ".join(_quoted(b) for b in BEST_BY)}',
            field="best_by",
        )
    if request.scoring == SCORING_FIRST:
        if request.best_by != "sum":
            raise DecideRequestError(
                f'decide: "best_by": {_quoted(request.best_by)} needs "scoring": "full" (under "first" '
                f'a choice is one token and is ranked by its log-prob, "sum")',
                field="best_by",
            )
        if request.unconditional is not None:
            raise DecideRequestError('decide: "unconditional" needs "scoring": "full"', field="unconditional")


def neutral_text(request: DecideRequest) -> str | None:
    """The neutral prompt a full-scored request also scores its choices after, or None."""
    if request.unconditional is not None:
        return request.unconditional
    return DEFAULT_NEUTRAL if request.best_by == "uncond" else None


def check_choices_fit(
    choices: Sequence[str], tokens: Sequence[Sequence[int]], n_before: int, n_ctx: int, before: str = "prompt"
) -> None:
    """Refuse a choice whose tokens do not fit the context after the ``n_before`` tokens of the
    prompt (or of the neutral prompt) they continue."""
    for i, t in enumerate(tokens):
        if n_before + len(t) > n_ctx:
            raise ChoiceTooLongError(
                f"decide: choice {i} ({choices[i][:40]!r}) is {len(t)} tokens and the {before} "
                f"{n_before}; together they do not fit the context of {n_ctx}: shorten the choice or "
                f"the {before}, or open the session with a larger context"
            )


def token_logps(first_logp: np.ndarray, rows_logp: np.ndarray | None, tokens: Sequence[int]) -> tuple[float, ...]:
    """A choice's per-token log-probs: its first token from the prompt's last row, each further
    token from the row after the token before it.

    ``first_logp  # [n_vocab]`` log-softmax after the prompt; ``rows_logp  # [len(tokens) - 1,
    n_vocab]`` log-softmax after each of the choice's tokens but the last (None for one token)."""
    out = [float(first_logp[tokens[0]])]
    if rows_logp is not None:
        out.extend(float(rows_logp[j, tokens[j + 1]]) for j in range(len(tokens) - 1))
    return tuple(out)


def full_scores(
    choices: Sequence[str],
    first_tokens: Sequence[int],
    first_logp: np.ndarray,
    per_token: Sequence[Sequence[float]],
    best_by: str,
    abstain_below: float | None,
    neutral: Sequence[Sequence[float]] | None = None,
) -> ChoiceScores:
    """The answer under "full" from each choice's per-token log-probs (and after the neutral
    prompt, when scored).

    ``p_outside`` has no whole-choice meaning (the choices' continuations need not be the only
    ones), so it is reported as under "first": the mass of the prompt's next token outside the
    choices' first tokens. ``abstained``: the probability of the whole best choice,
    ``exp(choice_logp[best])``, is under ``abstain_below``, whichever rule picked it."""
    sums = tuple(float(sum(t)) for t in per_token)  # in token order: "alone" sums the same way
    counts = tuple(len(t) for t in per_token)
    fields: dict[str, tuple[float, ...] | None] = {
        "choice_logp": sums,
        "choice_logp_mean": tuple(s / n for s, n in zip(sums, counts)),
        "choice_logp_norm": tuple(s / norm_chars(c) for s, c in zip(sums, choices)),
        "choice_logp_neutral": None,
        "choice_logp_uncond": None,
    }
    if neutral is not None:
        neutral_sums = tuple(float(sum(t)) for t in neutral)
        fields["choice_logp_neutral"] = neutral_sums
        fields["choice_logp_uncond"] = tuple(s - u for s, u in zip(sums, neutral_sums))
    ranked = fields[BEST_BY[best_by]]
    if ranked is None:  # the decider scores the neutral side whenever best_by is "uncond"
        raise ValueError('best_by "uncond" without the choices scored after a neutral prompt')
    best = int(np.argmax(np.asarray(ranked)))
    firsts = np.unique(np.asarray(first_tokens, dtype=np.int64))  # choices may share a first token
    abstained = abstain_below is not None and float(np.exp(sums[best])) < abstain_below
    return ChoiceScores(
        choice_logp=sums,
        best=-1 if abstained else best,
        p_outside=mass_outside(first_logp, firsts),
        abstained=abstained,
        scoring=SCORING_FULL,
        best_by=best_by,
        choice_tokens=counts,
        choice_logp_mean=fields["choice_logp_mean"],
        choice_logp_norm=fields["choice_logp_norm"],
        choice_token_logp=tuple(tuple(t) for t in per_token),
        choice_logp_neutral=fields["choice_logp_neutral"],
        choice_logp_uncond=fields["choice_logp_uncond"],
    )
