"""Full scoring (``scoring="full"``) and the neutral prompt's side, over a scripted backend.

The backend extends test_decide_policy's: a continuation prefilled on a fork gets rows that are a
pure function of the base's pieces plus that continuation as one piece, so "scored among others"
and "scored alone" agree only if the policy gives each continuation the same base and piece.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from bmoe.decide.continuations import UNCOND_CACHED, UNCOND_RESTORED, UNCOND_STORED
from bmoe.decide.errors import ChoiceTooLongError, DecideRequestError, EmptyChoiceError, NoSideSequenceError
from bmoe.decide.port import SIDE_MEMORY, SideSequences
from bmoe.decide.service import DecideService
from bmoe.decide.types import DecideRequest, DecideResult
from bmoe.wire.records import decide_fields
from helpers.decide import (
    FULL_CHOICES as CHOICES,
)
from helpers.decide import (
    PREFIX,
    SUFFIX,
    TOKEN_ID,
    ForkingBackend,
    ScriptedBackend,
    decide_service,
    fork_rows,
    full,
    hand_logp,
    logits_of,
    prompt_tokens,
    tokenize_text,
)


def decide(backend: ForkingBackend, request: DecideRequest, svc: DecideService | None = None) -> DecideResult:
    """``request`` answered by ``svc``, or by a new service over ``backend``."""
    return (svc or decide_service(backend, keep_prefix=True)).answer([request])[0]


def hand_scores(pieces: Sequence[tuple[int, ...]], choice: str) -> list[float]:
    """A choice's per-token log-probs computed by hand from the scripted logits."""
    toks = tokenize_text(choice, specials=False)
    out = [hand_logp(logits_of(list(pieces)), toks[0])]
    rows = fork_rows(pieces, toks[:-1]) if len(toks) > 1 else None
    out += [hand_logp(rows[j], toks[j + 1]) for j in range(len(toks) - 1)]
    return out


def prompt_pieces() -> list[tuple[int, ...]]:
    """How the prompt sits in the sequence with the prefix cache on: prefix piece, rest piece."""
    b = ForkingBackend()
    decide(b, full())
    return list(b.pieces)


# ---------------------------------------------------------------------------------------------
# Scores


def test_full_scores_match_a_hand_computation() -> None:
    b = ForkingBackend()
    r = decide(b, full())
    assert r.error is None
    sc = r.scores
    pieces = prompt_pieces()
    want = [hand_scores(pieces, c) for c in CHOICES]
    assert sc.scoring == "full" and sc.best_by == "sum"
    assert sc.choice_tokens == (1, 2, 2, 1)
    for i, c in enumerate(CHOICES):
        assert sc.choice_token_logp[i] == pytest.approx(want[i], abs=1e-9)
        assert sc.choice_logp[i] == pytest.approx(sum(want[i]), abs=1e-9)
        assert sc.choice_logp_mean[i] == pytest.approx(sum(want[i]) / len(want[i]), abs=1e-9)
        # per character, leading whitespace not counted (lm-eval's acc_norm)
        assert sc.choice_logp_norm[i] == pytest.approx(sum(want[i]) / len(c.lstrip()), abs=1e-9)
    assert sc.best == int(np.argmax(sc.choice_logp))
    assert sc.choice_logp_neutral is None and sc.choice_logp_uncond is None
    # p_outside: the next token's mass outside the choices' distinct first tokens (ab, Hello, c)
    row = logits_of(pieces)
    firsts = {TOKEN_ID["ab"], TOKEN_ID["Hello"], TOKEN_ID["c"]}
    inside = math.fsum(math.exp(hand_logp(row, t)) for t in firsts)
    assert sc.p_outside == pytest.approx(1.0 - inside, abs=1e-9)
    # only the multi-token choices were prefilled, all but their last token, in one call
    assert [c for c in b.calls if c[0] == "prefill_forks"] == [("prefill_forks", (1, 1), r.n_tokens)]
    assert r.score_tokens == 2 and r.score_s == pytest.approx(0.02)


@pytest.mark.parametrize("forks", [1, 2, 8])
def test_a_choice_scored_among_others_equals_it_scored_alone(forks: int) -> None:
    together = decide(ForkingBackend(forks=forks), full(CHOICES + ("Hello ab", "abc c")))
    n_calls = math.ceil(4 / forks)  # four of the six choices have more than one token
    assert together.score_tokens == 1 + 1 + 2 + 2  # all but the last token of abx, Hello world, Hello ab, abc c
    for i, c in enumerate(CHOICES + ("Hello ab", "abc c")):
        alone = decide(ForkingBackend(forks=forks), full((c,)))
        assert alone.scores.choice_token_logp[0] == together.scores.choice_token_logp[i]
        assert alone.scores.choice_logp[0] == together.scores.choice_logp[i]
    b = ForkingBackend(forks=forks)
    decide(b, full(CHOICES + ("Hello ab", "abc c")))
    assert sum(1 for c in b.calls if c[0] == "prefill_forks") == n_calls


def test_one_token_choices_need_no_fork() -> None:
    b = ForkingBackend()
    r = decide(b, full(("A", "B", "C")))
    first = decide(ScriptedBackend(), DecideRequest(id=1, prefix=PREFIX, suffix=SUFFIX, choices=("A", "B", "C")))
    assert "prefill_forks" not in b.touched()
    assert r.scores.choice_logp == first.scores.choice_logp  # the same number as "first" scoring
    assert r.scores.p_outside == first.scores.p_outside
    assert r.score_tokens == 0


@pytest.mark.parametrize("best_by", ["sum", "mean", "norm", "uncond"])
def test_best_by_picks_by_its_score_and_is_echoed(best_by: str) -> None:
    r = decide(ForkingBackend(), full(best_by=best_by))
    sc = r.scores
    field = {
        "sum": sc.choice_logp,
        "mean": sc.choice_logp_mean,
        "norm": sc.choice_logp_norm,
        "uncond": sc.choice_logp_uncond,
    }[best_by]
    assert sc.best_by == best_by and sc.best == int(np.argmax(field))
    out = decide_fields(r)
    assert out["best_by"] == best_by and out["scoring"] == "full"


def test_abstaining_compares_the_whole_choice_probability() -> None:
    r = decide(ForkingBackend(), full())
    p_best = math.exp(r.scores.choice_logp[r.scores.best])
    assert decide(ForkingBackend(), full(abstain_below=p_best * 1.001)).scores.best == -1
    kept = decide(ForkingBackend(), full(abstain_below=p_best))
    assert kept.scores.best == r.scores.best and not kept.scores.abstained


# ---------------------------------------------------------------------------------------------
# The sequence and the kept prefix state


def test_full_scoring_leaves_the_sequence_and_kept_state_as_first_scoring_does() -> None:
    b = ForkingBackend()
    svc = decide_service(b, keep_prefix=True)
    decide(b, full(), svc)
    f = ScriptedBackend()
    fsvc = decide_service(f, keep_prefix=True)
    decide(f, DecideRequest(id=1, prefix=PREFIX, suffix=SUFFIX, choices=("A",)), fsvc)
    assert b.pieces == f.pieces
    assert svc.decider.store.kept is not None and svc.decider.store.kept.tokens == fsvc.decider.store.kept.tokens
    # the next decision restores the kept prefix and answers what a fresh session answers
    nxt = decide(b, full(id=2), svc)
    assert nxt.reuse == "restored"
    assert nxt.scores == decide(ForkingBackend(), full(id=2)).scores


def test_a_failed_fork_is_an_error_and_the_session_goes_on() -> None:
    b = ForkingBackend()
    svc = decide_service(b, keep_prefix=True)
    b.fail_on = "prefill_forks"
    r = decide(b, full(), svc)
    assert r.error is not None and "scoring the choices" in r.error and "scripted failure" in r.error
    ok = decide(b, full(id=2), svc)
    assert ok.error is None and ok.reuse == "restored"
    assert ok.scores == decide(ForkingBackend(), full(id=2)).scores


# ---------------------------------------------------------------------------------------------
# Refusals: checked before anything touches the sequence


@pytest.mark.parametrize(
    ("request_", "backend", "exc", "message"),
    [
        (
            full(scoring="fuzzy"),
            {},
            DecideRequestError,
            'decide: "scoring" is "fuzzy"; give "first" (each choice by its first token) or "full" (by all its tokens)',
        ),
        (
            full(best_by="max"),
            {},
            DecideRequestError,
            'decide: "best_by" is "max"; give one of "sum", "mean", "norm", "uncond"',
        ),
        (
            DecideRequest(id=1, prefix=PREFIX, suffix=SUFFIX, choices=("A", "B"), best_by="norm"),
            {},
            DecideRequestError,
            'decide: "best_by": "norm" needs "scoring": "full" (under "first" a choice is one '
            'token and is ranked by its log-prob, "sum")',
        ),
        (
            DecideRequest(id=1, prefix=PREFIX, suffix=SUFFIX, choices=("A", "B"), unconditional="Answer:"),
            {},
            DecideRequestError,
            'decide: "unconditional" needs "scoring": "full"',
        ),
        (
            full(("A", "")),
            {},
            EmptyChoiceError,
            "decide: choice 1 ('') tokenizes to no tokens; give it a non-empty label",
        ),
        (
            full(("A", "Hello world" * 8)),
            {"n_ctx": 30},
            ChoiceTooLongError,
            "decide: choice 1 ('Hello worldHello worldHello worldHello w') is 16 tokens and the prompt 17; together "
            "they do not fit the context of 30: shorten the choice or the prompt, or open the session with a larger "
            "context",
        ),
        (
            full(("A", "B")),
            {"forks": 0},
            NoSideSequenceError,
            'decide: "scoring": "full" scores each choice on a side sequence and this session has none '
            "(--decide-batch 1): open it with --decide-batch auto (the default) or 2 or more "
            "(SessionConfig.decide_batch)",
        ),
        (
            full(("A", "B")),
            {"forks": 0, "sides": SideSequences(0, 0, SIDE_MEMORY, kv_bytes=90 * 2**20, room_bytes=60 * 2**20)},
            NoSideSequenceError,
            'decide: "scoring": "full" scores each choice on a side sequence and none fits in memory: one takes '
            "90.0 MiB (the KV of a 512-token sequence) and half of what this process may still allocate is 60.0 MiB; "
            "free memory, or open the session with a smaller --ctx-size",
        ),
        (
            full(("A", "B"), unconditional=""),
            {"template": False, "bos": False},
            DecideRequestError,
            'decide: the unconditional prompt renders to no tokens; give "unconditional" a neutral text, e.g. '
            '"Answer:"',
        ),
    ],
    ids=[
        "scoring",
        "best_by",
        "best_by-first",
        "uncond-first",
        "empty-choice",
        "too-long",
        "no-forks",
        "no-memory",
        "empty-neutral",
    ],
)
def test_refusals_touch_nothing(request_: DecideRequest, backend: dict, exc: type, message: str) -> None:
    b = ForkingBackend(**backend)
    r = decide(b, request_)
    assert isinstance(r.cause, exc) and r.refused
    assert r.error == message
    assert b.calls == []
    assert decide_fields(r) == {"id": 1, "error": message}


def test_first_token_collisions_are_refused_only_under_first() -> None:
    choices = ("ab", "abx")
    first = decide(ForkingBackend(), DecideRequest(id=1, prefix=PREFIX, suffix=SUFFIX, choices=choices))
    assert first.refused and "both start with token" in first.error
    assert decide(ForkingBackend(), full(choices)).error is None


def test_a_choice_that_just_fits_is_scored() -> None:
    n_prompt = len(prompt_tokens(PREFIX + SUFFIX))
    toks = tokenize_text("Hello world" * 8, specials=False)
    r = decide(ForkingBackend(n_ctx=n_prompt + len(toks)), full(("A", "Hello world" * 8)))
    assert r.error is None and r.scores.choice_tokens == (1, len(toks))


def test_a_batch_answers_the_others_around_a_bad_full_request() -> None:
    reqs = [
        full(id=1),
        full(id=2, best_by="max"),
        DecideRequest(id=3, prefix=PREFIX, suffix=" Other.", choices=("A", "B")),
        DecideRequest(id=4, prefix=PREFIX, suffix=" More.", choices=("A", "B")),
        full(id=5, best_by="norm"),
    ]
    b = ForkingBackend(batch=4)
    got = decide_service(b, keep_prefix=True).answer(reqs)
    assert [r.id for r in got] == [1, 2, 3, 4, 5]
    assert got[1].refused and got[1].error.startswith('decide: "best_by" is "max"')
    # the first-token decisions are batched together; the full ones run alone
    assert got[2].batch is not None and got[2].batch.size == 2 and got[0].batch is None and got[4].batch is None
    for r, q in zip(got, reqs):
        if r.error is None and q.scoring == "full":
            assert r.scores == decide(ForkingBackend(batch=4), q).scores


# ---------------------------------------------------------------------------------------------
# The neutral prompt


def neutral_pieces(text: str) -> list[tuple[int, ...]]:
    return [tuple(prompt_tokens(text))]


def test_unconditional_scores_match_a_hand_computation() -> None:
    r = decide(ForkingBackend(), full(unconditional="Answer:"))
    sc = r.scores
    for i, c in enumerate(CHOICES):
        want = sum(hand_scores(neutral_pieces("Answer:"), c))
        assert sc.choice_logp_neutral[i] == pytest.approx(want, abs=1e-9)
        assert sc.choice_logp_uncond[i] == sc.choice_logp[i] - sc.choice_logp_neutral[i]
    out = decide_fields(r)
    assert out["choice_logp_uncond"] == list(sc.choice_logp_uncond) and out["uncond_reuse"] == UNCOND_STORED


def test_the_neutral_side_is_prefilled_once_then_forked_then_remembered() -> None:
    b = ForkingBackend()
    svc = decide_service(b, keep_prefix=True)
    neutral = svc.decider.neutral
    r1 = decide(b, full(("A", "Hello world"), unconditional="Answer:"), svc)
    r2 = decide(b, full(("Hello world", "abx"), unconditional="Answer:"), svc)
    r3 = decide(b, full(("abx", "A"), unconditional="Answer:"), svc)
    assert [r.uncond_reuse for r in (r1, r2, r3)] == [UNCOND_STORED, UNCOND_RESTORED, UNCOND_CACHED]
    assert sum(1 for c in b.calls if c[0] == "prefill_apart") == 1
    # remembered and recomputed scores are the same numbers
    assert r2.scores.choice_logp_neutral[0] == r1.scores.choice_logp_neutral[1]
    assert r3.scores.choice_logp_neutral == (r2.scores.choice_logp_neutral[1], r1.scores.choice_logp_neutral[0])
    assert r3.score_tokens == 1  # only the conditional "abx" was prefilled
    assert r1.uncond_state_mib == pytest.approx(neutral.kept_mib) and neutral.kept_mib > 0
    # another neutral prompt replaces the kept one
    r4 = decide(b, full(("A",), unconditional="Other"), svc)
    assert r4.uncond_reuse == UNCOND_STORED and sum(1 for c in b.calls if c[0] == "prefill_apart") == 2
    # the main sequence never held the neutral prompt
    assert all(piece != tuple(prompt_tokens("Answer:")) for piece in b.pieces)


def test_best_by_uncond_without_a_prompt_uses_the_empty_user_message() -> None:
    r = decide(ForkingBackend(), full(best_by="uncond"))
    explicit = decide(ForkingBackend(), full(best_by="uncond", unconditional=""))
    assert r.scores == explicit.scores and r.scores.choice_logp_uncond is not None


def test_norm_counts_the_choice_without_its_leading_whitespace_as_lm_eval_does() -> None:
    from bmoe.decide.scoring_modes import norm_chars

    assert [norm_chars(c) for c in (" Paris", "Paris", "\n two words", " ", "")] == [5, 5, 9, 1, 1]
