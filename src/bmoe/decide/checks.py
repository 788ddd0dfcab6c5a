"""Every check that can refuse a plain decision, before anything touches the sequence: the request
as tokens (its prompt split at the prefix, its choices), or its refusal. Reads the text port and
what the sequence port says of its size and side sequences; prefills nothing (docs/decide.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from bmoe.decide.choice_scorer import check_prompt_fits, first_tokens, tokenize_choices
from bmoe.decide.errors import DecideBackendError, DecideRefusal, DecideRequestError, NoSideSequenceError
from bmoe.decide.port import (
    BYTES_PER_MIB,
    SIDE_FAILED,
    SIDE_MEMORY,
    SequencePort,
    SideSequences,
    TextPort,
    is_image_token,
)
from bmoe.decide.prompt_split import SplitPrompt, split_prompt
from bmoe.decide.scoring_modes import SCORING_FULL, check_choices_fit, check_scoring_fields, neutral_text
from bmoe.decide.types import DecideRequest, DecideResult, check_abstain_below


@dataclass(frozen=True, slots=True)
class Tokenized:
    """A request that passed every check, as tokens; nothing has touched the sequence yet."""

    prompt: SplitPrompt
    first: tuple[int, ...]  # [n_choices] first token of each choice
    tokens: tuple[tuple[int, ...], ...] | None = None  # scoring "full": every token of each choice
    neutral: tuple[int, ...] | None = None  # scoring "full" with a neutral prompt: its tokens


Checked = Union[Tokenized, DecideResult]  # a request that passed its checks, or its refusal


def check_requests(text: TextPort, seq: SequencePort, requests: Sequence[DecideRequest]) -> list[Checked]:
    """Each request tokenized, or its failed result: refused by a check, or the text port failed
    rendering or tokenizing its prompt."""
    out: list[Checked] = []
    for request in requests:
        try:
            out.append(_tokenize(text, seq, request))
        except DecideRefusal as exc:
            out.append(DecideResult.failed(request.id, str(exc), exc))
        except Exception as exc:  # a backend failure while rendering or tokenizing
            out.append(DecideResult.failed(request.id, failure_message("preparing the prompt", exc), exc))
    return out


def failure_message(stage: str, exc: Exception) -> str:
    """An ``error`` for a backend failure during ``stage``: its own message when it is decide's."""
    if isinstance(exc, DecideBackendError):
        return str(exc)
    return f"decide: the backend failed while {stage}: {type(exc).__name__}: {exc}"


def shares_prefix(request: DecideRequest, tok: Tokenized) -> bool:
    """Whether the request can share its prefix piece with others: a first-token decision that
    keeps a non-empty prefix."""
    # A suffix holding an image runs alone: an image is prefilled by itself, not beside others.
    return bool(
        request.reuse_prefix
        and tok.prompt.n_prefix
        and tok.tokens is None
        and not any(is_image_token(t) for t in tok.prompt.tokens[tok.prompt.n_prefix :])
    )


def wants_side_sequences(requests: Sequence[DecideRequest], checked: Sequence[Checked], keep_prefix: bool) -> bool:
    """Whether answering ``checked`` (``check_requests``'s answer for ``requests``) would use side
    sequences: a full-scored request (its choices are scored on them), or, with the prefix cache
    on, two first-token decisions that keep the same prefix (a batch)."""
    seen: set[tuple[int, ...]] = set()
    for request, tok in zip(requests, checked):
        if isinstance(tok, DecideResult):
            continue
        if tok.tokens is not None:
            return True
        if keep_prefix and shares_prefix(request, tok):
            if tok.prompt.prefix_tokens in seen:
                return True
            seen.add(tok.prompt.prefix_tokens)
    return False


def _tokenize(text: TextPort, seq: SequencePort, request: DecideRequest) -> Tokenized:
    check_abstain_below(request.abstain_below)
    check_scoring_fields(request)
    if request.scoring == SCORING_FULL:
        return _tokenize_full(text, seq, request)
    first = first_tokens(text, request.choices)
    prompt = split_prompt(text, request.prefix, request.suffix, request.images, request.history)
    check_prompt_fits(prompt.n_tokens, seq.n_ctx(), sum(1 for t in prompt.tokens if is_image_token(t)))
    return Tokenized(prompt=prompt, first=first)


def _tokenize_full(text: TextPort, seq: SequencePort, request: DecideRequest) -> Tokenized:
    """The checks of a full-scored request: every choice's tokens fit after the prompt (and after
    the neutral prompt), on side sequences the backend has."""
    tokens = tokenize_choices(text, request.choices)  # first tokens may collide: all are scored
    prompt = split_prompt(text, request.prefix, request.suffix, request.images, request.history)
    n_ctx = seq.n_ctx()
    check_prompt_fits(prompt.n_tokens, n_ctx, sum(1 for t in prompt.tokens if is_image_token(t)))
    sides = seq.side_sequences()  # open or to be opened before the request runs (the decider)
    if sides.n_most < 1:
        raise NoSideSequenceError(no_side_sequence_message(sides, n_ctx))
    check_choices_fit(request.choices, tokens, prompt.n_tokens, n_ctx)
    neutral: tuple[int, ...] | None = None
    neutral_prompt = neutral_text(request)
    if neutral_prompt is not None:
        neutral = tuple(text.tokenize_prompts([text.render_user(neutral_prompt)])[0])
        if not neutral:
            raise DecideRequestError(
                'decide: the unconditional prompt renders to no tokens; give "unconditional" a neutral '
                'text, e.g. "Answer:"',
                field="unconditional",
            )
        check_choices_fit(request.choices, tokens, len(neutral), n_ctx, before="unconditional prompt")
    return Tokenized(prompt=prompt, first=tuple(t[0] for t in tokens), tokens=tokens, neutral=neutral)


def no_side_sequence_message(sides: SideSequences, n_ctx: int) -> str:
    """The refusal of full scoring where the backend has no side sequence and will open none."""
    head = 'decide: "scoring": "full" scores each choice on a side sequence'
    if sides.why_none == SIDE_MEMORY:
        return (
            f"{head} and none fits in memory: one takes {sides.kv_bytes / BYTES_PER_MIB:.1f} MiB (the KV of a "
            f"{n_ctx}-token sequence) and half of what this process may still allocate is "
            f"{sides.room_bytes / BYTES_PER_MIB:.1f} MiB; free memory, or open the session with a smaller "
            "--ctx-size"
        )
    if sides.why_none == SIDE_FAILED:
        return f"{head} and opening them failed: {sides.detail}"
    return (
        f"{head} and this session has none (--decide-batch 1): open it with --decide-batch auto (the "
        "default) or 2 or more (SessionConfig.decide_batch)"
    )
