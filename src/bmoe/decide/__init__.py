"""Decide: pick one of a fixed list of choices from one prefill, with the prefix state kept.

This package is policy over token ids and one logit row; it imports nothing of the engine.
``DecideService`` (service.py) is a session's decide, driven only through the ``DecideBackend``
port; ``bmoe.runtime.decide`` is the one adapter that implements it over a loaded model;
nothing here imports it.
"""
from bmoe.decide.choice_scorer import check_prompt_fits, first_tokens, score_choices, tokenize_choices
from bmoe.decide.continuations import (
    UNCOND_CACHED,
    UNCOND_RESTORED,
    UNCOND_STORED,
    NeutralStore,
    continuation_logps,
)
from bmoe.decide.debias import DebiasState, NoPriorError, answer_debiased, combine, expand
from bmoe.decide.decider import (
    REUSE_MISS,
    REUSE_NO_PREFIX,
    REUSE_OFF,
    REUSE_OPTED_OUT,
    REUSE_RESTORED,
    REUSE_RESTORED_STORED,
    REUSE_STORED,
    DecidePolicy,
    answer_checked,
    answer_many,
    answer_one,
    check_requests,
    wants_side_sequences,
)
from bmoe.decide.errors import (
    ChoiceCollisionError,
    ChoiceTooLongError,
    DecideBackendError,
    DecideRefusal,
    DecideRequestError,
    EmptyChoiceError,
    EmptyPromptError,
    NoChoicesError,
    NoSideSequenceError,
    PromptTooLongError,
)
from bmoe.decide.port import DecideBackend, KeptPrefix, KeptState, PrefillCost
from bmoe.decide.kept_prefix import (
    LastPrefixStore,
    Lookup,
    PrefixStore,
    resolve_keep_prefix,
)
from bmoe.decide.prompt_split import SplitPrompt, split_prompt
from bmoe.decide.scoring_modes import (
    BEST_BY,
    DEFAULT_NEUTRAL,
    SCORING_FIRST,
    SCORING_FULL,
    SCORING_MODES,
    full_scores,
)
from bmoe.decide.service import DecideService
from bmoe.decide.option_list import CONTENT_FREE, DEBIAS_MODES, render_block, rendered
from bmoe.decide.types import ChoiceScores, DebiasScores, DecideRequest, DecideResult, RenderRule

__all__ = [
    "CONTENT_FREE",
    "DEBIAS_MODES",
    "DebiasScores",
    "DebiasState",
    "NoPriorError",
    "RenderRule",
    "answer_debiased",
    "combine",
    "expand",
    "DecideService",
    "render_block",
    "rendered",
    "BEST_BY",
    "DEFAULT_NEUTRAL",
    "SCORING_FIRST",
    "SCORING_FULL",
    "SCORING_MODES",
    "UNCOND_CACHED",
    "UNCOND_RESTORED",
    "UNCOND_STORED",
    "ChoiceTooLongError",
    "NeutralStore",
    "NoSideSequenceError",
    "continuation_logps",
    "full_scores",
    "tokenize_choices",
    "REUSE_MISS",
    "REUSE_NO_PREFIX",
    "REUSE_OFF",
    "REUSE_OPTED_OUT",
    "REUSE_RESTORED",
    "REUSE_RESTORED_STORED",
    "REUSE_STORED",
    "ChoiceCollisionError",
    "ChoiceScores",
    "DecideBackend",
    "DecideBackendError",
    "DecidePolicy",
    "DecideRefusal",
    "DecideRequest",
    "DecideRequestError",
    "DecideResult",
    "EmptyChoiceError",
    "EmptyPromptError",
    "KeptPrefix",
    "KeptState",
    "LastPrefixStore",
    "Lookup",
    "NoChoicesError",
    "PrefillCost",
    "PrefixStore",
    "PromptTooLongError",
    "SplitPrompt",
    "check_prompt_fits",
    "first_tokens",
    "resolve_keep_prefix",
    "answer_checked",
    "answer_many",
    "answer_one",
    "check_requests",
    "wants_side_sequences",
    "score_choices",
    "split_prompt",
]
