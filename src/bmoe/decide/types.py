"""The decide request and result, and the BMOE_DECIDE object a result becomes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bmoe.decide.errors import DecideRefusal, DecideRequestError
from bmoe.image_refs import ImageSource

DEFAULT_TEMPLATE = "{question}\n{options}\n{cue}"
DEFAULT_OPTION = "{label}) {text}"
DEFAULT_JOINER = "\n"
DEFAULT_CUE = "Answer with the letter."


@dataclass(frozen=True, slots=True)
class RenderRule:
    """How the structured form's option list becomes text (docs/decide.md "Order debiasing").

    The block ``template`` (with ``{question}``, ``{options}`` and ``{cue}`` replaced) is appended
    to the request's ``suffix``; ``{options}`` is every option as ``option`` (``{label}``,
    ``{text}``) joined by ``joiner``. ``labels`` None: A, B, C, ... as many as there are options."""

    template: str = DEFAULT_TEMPLATE
    option: str = DEFAULT_OPTION
    joiner: str = DEFAULT_JOINER
    cue: str = DEFAULT_CUE
    labels: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class DecideRequest:
    """One decision: which of ``choices`` the model answers after ``prefix + suffix``.

    ``prefix`` is the part worth keeping for the next request (instructions, task, history);
    the model sees ``prefix + suffix`` as one user message either way.
    """

    id: int
    prefix: str
    suffix: str
    choices: tuple[str, ...]
    reuse_prefix: bool = True
    # best is -1 (abstained) when the best choice's probability is under this.
    abstain_below: float | None = None
    # "first": each choice scored by its first token; "full": by all its tokens (docs/decide.md
    # "Scoring modes"). Checked by the decider, so a bad value is a refusal of this request only.
    scoring: str = "first"
    best_by: str = "sum"  # which score picks best: sum, mean, norm or uncond (full only but sum)
    # full only: the neutral prompt (one user message) choices are also scored after; None with
    # best_by "uncond" means the default neutral prompt, an empty user message.
    unconditional: str | None = None
    # The structured form (docs/decide.md "Order debiasing"): bmoe renders ``question`` and
    # ``options`` after ``suffix`` by ``render``, and the choices are the labels. ``choices`` is
    # then empty. ``debias`` ("permute", "pride", "contextual") needs this form.
    question: str | None = None
    options: tuple[str, ...] | None = None
    render: RenderRule | None = None
    debias: str | None = None
    # images (file paths, data: URLs or bytes: bmoe.image_refs) placed at the markers of prefix +
    # suffix (bmoe.rules.IMAGE_MARKER), or, without one, all in front of the prefix: they are then
    # kept with it (docs/decide.md "Images")
    images: tuple[ImageSource, ...] = ()
    # Python only (no wire field): the conversation before the user message prefix + suffix, as
    # (role, content) pairs, rendered by the same template in front of it and kept with the prefix
    # (bmoe-server's bmoe_logprobs_of decides over a chat conversation this way)
    history: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class DebiasScores:
    """What order debiasing adds to an answer: probabilities over the options (request order,
    summing to 1) after the position bias was taken out, and what was taken out."""

    mode: str  # "permute", "pride" or "contextual"
    debiased_p: tuple[float, ...]  # [n_options]
    best_raw: int  # argmax of choice_logp, the options in the request's order
    prior: tuple[float, ...] | None = None  # [n_options] probability per label position, sums to 1
    prior_samples: int | None = None  # pride: requests the session's prior is estimated from
    decisions: int = 1  # decisions run for this answer (permutations, the content-free prompt)
    prefill_s: float = 0.0  # their prefill (and scoring) seconds, all of them together
    stage: str | None = None  # pride: "sample" (permuted, estimating) or "prior" (divided)


@dataclass(frozen=True, slots=True)
class ChoiceScores:
    """The answer: per choice, its log-probability and the scores derived from it.

    Under ``scoring="first"`` only the first four fields are set, and ``choice_logp`` is the first
    token's log-probability. Under ``"full"`` ``choice_logp`` is the sum over all the choice's
    tokens, and the ``choice_*`` tuples below are filled (``choice_logp_neutral`` and
    ``choice_logp_uncond`` only when the choices were also scored after a neutral prompt)."""

    choice_logp: tuple[float, ...]  # [n_choices], normalised over the whole vocabulary
    best: int  # -1 when abstained
    p_outside: float  # probability mass on first tokens that start no choice
    abstained: bool
    scoring: str = "first"
    best_by: str = "sum"  # which of the scores picked best
    choice_tokens: tuple[int, ...] | None = None  # [n_choices] tokens scored per choice
    choice_logp_mean: tuple[float, ...] | None = None  # choice_logp / choice_tokens
    choice_logp_norm: tuple[float, ...] | None = None  # choice_logp / characters of the choice text
    choice_token_logp: tuple[tuple[float, ...], ...] | None = None  # [n_choices][n_tokens_i]
    choice_logp_neutral: tuple[float, ...] | None = None  # summed log-prob after the neutral prompt
    choice_logp_uncond: tuple[float, ...] | None = None  # choice_logp - choice_logp_neutral


@dataclass(frozen=True, slots=True)
class BatchShare:
    """A decision prefilled together with others (``decide_many`` with a batching backend): the
    whole batch's prefill, of which the decision's own figures are its share by tokens."""

    id: int  # the batch's number in this session, from 1
    size: int  # decisions prefilled together
    n_tokens: int  # suffix tokens of all of them
    prefill_s: float  # the whole batch's prefill time
    read_mb: float | None = None  # the whole batch's expert reads (streamed models only)


@dataclass(frozen=True, slots=True)
class DecideResult:
    """Everything BMOE_DECIDE reports about one request.

    A refused or failed request has ``error`` set and none of the scores. ``cause`` is not
    reported: it keeps the exception for the session, a ``DecideRefusal`` (nothing was touched)
    or the backend's own exception (the sequence holds whatever the failed call left).
    """

    id: int
    error: str | None = None
    scores: ChoiceScores | None = None
    n_tokens: int = 0  # tokens of the whole rendered prompt
    n_reused: int = 0  # of those, restored from the kept prefix state instead of prefilled
    prefill_s: float = 0.0
    prefill_tps: float = 0.0  # prefilled tokens (n_tokens - n_reused) per prefill second
    read_mb: float | None = None
    cache_hit_pct: float | None = None
    prefill_dev_tokens: int | None = None
    prefix_state_mib: float = 0.0  # RAM the backend holds for the kept prefix state after this request
    store_s: float = 0.0
    restore_s: float = 0.0
    reuse: str = ""
    reuse_tier: str = ""  # "ram" or "disk": where the restored prefix state came from; "" when none
    batch: BatchShare | None = None  # set when prefilled together with other decisions
    # scoring "full": what scoring the choices cost beyond the prompt (their tokens on side
    # sequences, and the neutral prompt when it was prefilled), and how the neutral side was got.
    score_tokens: int = 0
    score_s: float = 0.0
    score_read_mb: float | None = None
    uncond_reuse: str | None = None  # "stored", "restored" or "cached"; None without unconditional
    uncond_state_mib: float | None = None  # the kept neutral prompt state's size after this request
    debias: DebiasScores | None = None  # set when the request asked for order debiasing
    cause: Exception | None = field(default=None, compare=False, repr=False)

    @classmethod
    def failed(cls, request_id: int, message: str, cause: Exception) -> DecideResult:
        return cls(id=request_id, error=message, cause=cause)

    @property
    def refused(self) -> bool:
        """True when the request was turned down before the backend was touched."""
        return isinstance(self.cause, DecideRefusal)


def check_abstain_below(value: float | None) -> None:
    """Refuse a threshold that is not a probability (NaN included)."""
    if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise DecideRequestError(
            f'decide: "abstain_below" is {value}; give a probability between 0 and 1', field="abstain_below"
        )
