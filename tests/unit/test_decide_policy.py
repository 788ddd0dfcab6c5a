"""The decide policy over a scripted backend (no model).

The scripted backend's "KV" is the list of prefill pieces it has seen, and its logits are a pure
function of that list. Like llama.cpp, it therefore answers differently for the same tokens
prefilled in different pieces, so a test that restored and fresh results are equal really checks
the decider's sequencing, not just the token ids.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmoe.decide.choice_scorer import score_choices
from bmoe.decide.decider import (
    REUSE_OFF,
    REUSE_OPTED_OUT,
    REUSE_RESTORED,
    REUSE_RESTORED_STORED,
    REUSE_STORED,
    DecidePolicy,
)
from bmoe.decide.errors import (
    ChoiceCollisionError,
    DecideRequestError,
    EmptyChoiceError,
    EmptyPromptError,
    NoChoicesError,
    PromptTooLongError,
)
from bmoe.decide.kept_prefix import PrefixStore, resolve_keep_prefix
from bmoe.decide.port import KeptState, PrefillCost
from bmoe.decide.prompt_split import split_prompt
from bmoe.decide.service import DecideService
from bmoe.decide.types import DecideRequest, DecideResult
from bmoe.numerics import common_prefix_len
from bmoe.state_store import StateStore
from bmoe.wire.records import decide_fields
from helpers.decide import (
    ASSISTANT,
    BOS,
    END,
    TOKEN_ID,
    USER,
    ScriptedBackend,
    ScriptedFailure,
    decide_service,
    hand_logp,
    logits_of,
    prompt_tokens,
    tokenize_text,
)

ON = DecidePolicy(keep_prefix=True)
OFF = DecidePolicy(keep_prefix=False)
CHOICES = ("A", "B", "C")


def req(
    prefix: str,
    suffix: str = " Pick one.",
    *,
    id: int = 1,
    choices: tuple[str, ...] = CHOICES,
    reuse_prefix: bool = True,
    abstain_below: float | None = None,
) -> DecideRequest:
    return DecideRequest(
        id=id,
        prefix=prefix,
        suffix=suffix,
        choices=choices,
        reuse_prefix=reuse_prefix,
        abstain_below=abstain_below,
    )


def fresh(request: DecideRequest, policy: DecidePolicy = ON) -> DecideResult:
    """The same request on a new backend with nothing kept."""
    return decide_service(ScriptedBackend(), keep_prefix=policy.keep_prefix).answer([request])[0]


def untimed(result: DecideResult) -> DecideResult:
    """A result without its wall-clock fields, for comparing two runs."""
    return replace(result, store_s=0.0, restore_s=0.0)


# ---------------------------------------------------------------------------------------------
# The split rule


def test_split_gives_one_token_back_at_the_join() -> None:
    b = ScriptedBackend()
    split = split_prompt(b, "Task: x. ", "Pick one.")
    assert split.tokens == tuple(prompt_tokens("Task: x. Pick one."))
    alone = prompt_tokens("Task: x. ")
    # alone and whole agree up to the end of the prefix text (everything but <e><a>)
    assert common_prefix_len(split.tokens, alone) == len(alone) - 2
    assert split.n_prefix == len(alone) - 3
    assert split.prefix_tokens == tuple(alone[: len(alone) - 3])


def test_split_on_tokens_when_the_join_merges() -> None:
    b = ScriptedBackend()
    # "a" + "bc" renders as the one token "abc": the prefix's "a" is not in the prompt at all.
    split = split_prompt(b, "xa", "bc")
    assert split.tokens == (BOS, USER, TOKEN_ID["x"], TOKEN_ID["abc"], END, ASSISTANT)
    assert split.n_prefix == 2  # <s><u>x shared, one given back
    assert split.prefix_tokens == (BOS, USER)


def test_history_is_rendered_in_front_and_kept_with_the_prefix() -> None:
    """DecideRequest.history (bmoe-server's bmoe_logprobs_of over a conversation): the messages
    before the user's are rendered first and fall in the keepable prefix."""
    split = split_prompt(ScriptedBackend(), "", "Pick", history=(("user", "Hello"), ("assistant", "Yes")))
    head = (BOS, USER, TOKEN_ID["Hello"], END, ASSISTANT, TOKEN_ID["Yes"], END, USER)
    assert split.tokens == head + (TOKEN_ID["Pick"], END, ASSISTANT)
    assert split.prefix_tokens == head[:-1]  # the history; one token given back at the join


def test_split_with_empty_suffix_leaves_one_token_to_prefill() -> None:
    split = split_prompt(ScriptedBackend(), "Hello world", "")
    assert split.n_prefix == split.n_tokens - 1


def test_split_without_template_or_bos_can_have_no_prefix() -> None:
    split = split_prompt(ScriptedBackend(template=False, bos=False), "", "Pick")
    assert split.tokens == (TOKEN_ID["Pick"],)
    assert split.n_prefix == 0


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abc xHel", max_size=12), st.text(alphabet="abc xHel", max_size=12))
def test_split_prefix_is_shared_by_both_renderings(prefix: str, suffix: str) -> None:
    b = ScriptedBackend()
    split = split_prompt(b, prefix, suffix)
    alone = tuple(prompt_tokens(prefix))
    assert split.tokens == tuple(prompt_tokens(prefix + suffix))
    assert 0 <= split.n_prefix < split.n_tokens
    assert alone[: split.n_prefix] == split.prefix_tokens


# ---------------------------------------------------------------------------------------------
# Up-front checks: exact messages, nothing prefilled, the kept state unchanged


def primed() -> tuple[ScriptedBackend, DecideService]:
    b = ScriptedBackend()
    svc = decide_service(b, keep_prefix=True)
    assert svc.answer([req("Task: x. ")])[0].error is None
    b.calls.clear()
    return b, svc


@pytest.mark.parametrize(
    ("request_", "exc_type", "message"),
    [
        (req("T", choices=()), NoChoicesError, 'decide: choices is empty; give at least one choice, e.g. ["A","B"]'),
        (
            req("T", choices=("A", "")),
            EmptyChoiceError,
            "decide: choice 1 ('') tokenizes to no tokens; give it a non-empty label",
        ),
        (
            req("T", choices=("A", "ab", "B", "ab!")),
            ChoiceCollisionError,
            f"decide: choices 1 ('ab') and 3 ('ab!') both start with token {TOKEN_ID['ab']} ('ab'); "
            "a choice is scored by its first token, so they cannot be told apart: give labels that "
            "start differently (A, B, C, ...)",
        ),
        (
            req("T" * 30, "x" * 30),
            PromptTooLongError,
            "decide: the prompt is 64 tokens but the context holds 63; shorten the prefix or suffix, "
            "or open the session with a larger context",
        ),
        (
            req("T", abstain_below=1.5),
            DecideRequestError,
            'decide: "abstain_below" is 1.5; give a probability between 0 and 1',
        ),
        (
            req("T", abstain_below=float("nan")),
            DecideRequestError,
            'decide: "abstain_below" is nan; give a probability between 0 and 1',
        ),
    ],
)
def test_refusals_touch_nothing(request_: DecideRequest, exc_type: type[Exception], message: str) -> None:
    b, svc = primed()
    b._n_ctx = 63
    kept = svc.decider.store.kept
    result = svc.answer([request_])[0]
    assert result.error == message
    assert isinstance(result.cause, exc_type)
    assert result.refused
    assert result.scores is None
    assert decide_fields(result) == {"id": 1, "error": message}
    assert b.calls == []
    assert svc.decider.store.kept is kept


def test_prompt_of_exactly_n_ctx_tokens_fits() -> None:
    r = req("T" * 30, "x" * 30)
    assert len(prompt_tokens("T" * 30 + "x" * 30)) == 64
    assert decide_service(ScriptedBackend(n_ctx=64), keep_prefix=True).answer([r])[0].error is None


def test_empty_prompt_is_refused() -> None:
    b = ScriptedBackend(template=False, bos=False)
    result = decide_service(b, keep_prefix=True).answer([req("", "")])[0]
    assert result.error == "decide: the prompt renders to no tokens; give a prefix or a suffix"
    assert isinstance(result.cause, EmptyPromptError)
    assert b.calls == []


# ---------------------------------------------------------------------------------------------
# Scoring


def test_score_choices_against_a_hand_computation() -> None:
    p = [0.5, 0.25, 0.125, 0.0625, 0.0625]
    logits = np.log(np.array(p, dtype=np.float64)).astype(np.float32) + np.float32(7.0)
    s = score_choices(logits, [2, 0], None)
    assert s.choice_logp == pytest.approx([math.log(0.125), math.log(0.5)], abs=1e-6)
    assert s.best == 1
    assert s.p_outside == pytest.approx(0.375, abs=1e-6)
    assert not s.abstained


def test_decision_scores_match_the_logit_row() -> None:
    b = ScriptedBackend()
    result = decide_service(b, keep_prefix=True).answer([req("Task: x. ", choices=("A", "Yes", "c"))])[0]
    row = b.last_logits()
    ids = [TOKEN_ID["A"], TOKEN_ID["Yes"], TOKEN_ID["c"]]
    expected = [hand_logp(row, t) for t in ids]
    assert result.scores is not None
    assert result.scores.choice_logp == pytest.approx(expected, abs=1e-12)
    assert result.scores.best == int(np.argmax(expected))
    assert result.scores.p_outside == pytest.approx(1 - sum(math.exp(v) for v in expected), abs=1e-12)
    assert result.scores.abstained is False


@pytest.mark.parametrize(("threshold", "abstains"), [(0.6, True), (0.5, False), (0.4, False), (0.0, False)])
def test_abstention_is_strictly_below_the_threshold(threshold: float, abstains: bool) -> None:
    logits = np.log(np.array([0.5, 0.3, 0.2])).astype(np.float64)
    s = score_choices(logits, [0, 1], threshold)
    assert s.abstained is abstains
    assert s.best == (-1 if abstains else 0)
    assert s.choice_logp == pytest.approx([math.log(0.5), math.log(0.3)])


def test_abstained_decision_still_reports_scores() -> None:
    result = decide_service(ScriptedBackend(), keep_prefix=True).answer([req("Task: x. ", abstain_below=1.0)])[0]
    assert result.scores is not None and result.scores.abstained and result.scores.best == -1
    out = decide_fields(result)
    assert out["best"] == -1 and out["abstained"] is True
    assert out["choice_logp"] == list(result.scores.choice_logp)


# ---------------------------------------------------------------------------------------------
# The kept state: restored, stored, left alone


def test_first_decision_prefills_two_pieces_and_stores_the_prefix() -> None:
    b = ScriptedBackend()
    svc = decide_service(b, keep_prefix=True)
    r = req("Task: x. ")
    split = split_prompt(b, r.prefix, r.suffix)
    result = svc.answer([r])[0]
    n = split.n_prefix
    assert result.reuse == REUSE_STORED
    assert (result.n_tokens, result.n_reused) == (split.n_tokens, 0)
    assert b.calls == [
        ("clear", (), 0),
        ("prefill", split.tokens[:n], 0),
        ("save_state", (), n),
        ("prefill", split.tokens[n:], n),
    ]
    assert svc.decider.store.kept is not None and svc.decider.store.kept.tokens == split.prefix_tokens
    assert result.prefix_state_mib == svc.decider.store.kept.state.nbytes / 2**20 > 0
    assert result.restore_s == 0.0 and result.store_s >= 0.0


def test_same_prefix_restores_and_prefills_only_the_rest() -> None:
    b = ScriptedBackend()
    svc = decide_service(b, keep_prefix=True)
    svc.answer([req("Task: x. ")])[0]
    kept = svc.decider.store.kept
    b.calls.clear()
    r = req("Task: x. ", " Pick again.")
    split = split_prompt(b, r.prefix, r.suffix)
    result = svc.answer([r])[0]
    assert result.reuse == REUSE_RESTORED
    assert (result.n_tokens, result.n_reused) == (split.n_tokens, split.n_prefix)
    assert b.calls == [
        ("load_state", (), split.n_prefix),
        ("prefill", split.tokens[split.n_prefix :], split.n_prefix),
    ]
    assert svc.decider.store.kept is kept
    assert result.store_s == 0.0
    assert result.prefill_s == 0.25 * (split.n_tokens - split.n_prefix)
    assert result.prefill_tps == pytest.approx(4.0)


def test_grown_prefix_restores_then_stores_the_longer_prefix() -> None:
    b = ScriptedBackend()
    svc = decide_service(b, keep_prefix=True)
    first = split_prompt(b, "Task: x. ", " Pick one.")
    svc.answer([req("Task: x. ")])[0]
    b.calls.clear()
    r = req("Task: x. Hello world. ")
    split = split_prompt(b, r.prefix, r.suffix)
    result = svc.answer([r])[0]
    k, n = first.n_prefix, split.n_prefix
    assert result.reuse == REUSE_RESTORED_STORED
    assert (result.n_tokens, result.n_reused) == (split.n_tokens, k)
    assert b.calls == [
        ("load_state", (), k),
        ("prefill", split.tokens[k:n], k),
        ("save_state", (), n),
        ("prefill", split.tokens[n:], n),
    ]
    assert svc.decider.store.kept is not None and svc.decider.store.kept.tokens == split.prefix_tokens


def test_a_prefix_whose_last_token_grows_into_a_merge_still_restores() -> None:
    # "Task: a" ends on the token "a"; the next prefix "Task: ab. " turns it into "ab". The token
    # given back at the join kept "a" out of the stored prefix, so the grown prefix still hits.
    b = ScriptedBackend()
    svc = decide_service(b, keep_prefix=True)
    first = svc.answer([req("Task: a", " Pick")])[0]
    assert svc.decider.store.kept is not None and TOKEN_ID["a"] not in svc.decider.store.kept.tokens
    grown = svc.answer([req("Task: ab. ", " Pick")])[0]
    assert (first.reuse, grown.reuse) == (REUSE_STORED, REUSE_RESTORED_STORED)
    assert grown.n_reused == first.n_tokens - len(tokenize_text(" Pick<e><a>", specials=True)) - 1


def test_different_prefix_is_a_miss_at_the_first_differing_token() -> None:
    b = ScriptedBackend()
    svc = decide_service(b, keep_prefix=True)
    svc.answer([req("Task: x. ")])[0]
    old = svc.decider.store.kept
    assert old is not None
    r = req("Task: y. ")
    split = split_prompt(b, r.prefix, r.suffix)
    at = common_prefix_len(old.tokens, split.prefix_tokens)
    assert at == 5  # <s> <u> Task : " " -> then the x/y token
    b.calls.clear()
    result = svc.answer([r])[0]
    assert result.reuse == f"miss: prefix differs at token {at}"
    assert result.n_reused == 0
    assert b.touched() == ["clear", "prefill", "save_state", "prefill"]
    assert svc.decider.store.kept is not None and svc.decider.store.kept.tokens == split.prefix_tokens


def test_shorter_prefix_is_a_miss_where_it_ends() -> None:
    b = ScriptedBackend()
    svc = decide_service(b, keep_prefix=True)
    svc.answer([req("Task: x. Hello world. ")])[0]
    r = req("Task: x. ")
    split = split_prompt(b, r.prefix, r.suffix)
    result = svc.answer([r])[0]
    assert result.reuse == f"miss: prefix differs at token {split.n_prefix}"


def test_opted_out_prefills_whole_and_leaves_the_kept_state() -> None:
    b, svc = primed()
    kept = svc.decider.store.kept
    r = req("Task: x. ", reuse_prefix=False)
    split = split_prompt(b, r.prefix, r.suffix)
    result = svc.answer([r])[0]
    assert result.reuse == REUSE_OPTED_OUT
    assert b.calls == [("clear", (), 0), ("prefill", split.tokens, 0)]
    assert svc.decider.store.kept is kept
    assert result.n_reused == 0 and result.n_tokens == split.n_tokens
    assert kept is not None and result.prefix_state_mib == kept.state.mib
    # whole prefill: the logits of the prompt as one piece
    assert result.scores == score_choices(logits_of([split.tokens]), [TOKEN_ID[c] for c in CHOICES], None)


def test_policy_off_never_touches_the_cache() -> None:
    b = ScriptedBackend()
    svc = decide_service(b, keep_prefix=False)
    result = svc.answer([req("Task: x. ")])[0]
    assert result.reuse == REUSE_OFF
    assert b.touched() == ["clear", "prefill"]
    assert svc.decider.store.kept is None and result.prefix_state_mib == 0.0


def test_no_prefix_on_tokens_prefills_whole() -> None:
    b = ScriptedBackend(template=False, bos=False)
    svc = decide_service(b, keep_prefix=True)
    result = svc.answer([req("", "Pick")])[0]
    assert result.reuse == "no prefix"
    assert b.touched() == ["clear", "prefill"]
    assert svc.decider.store.kept is None


def test_drop_frees_the_state_and_the_next_decision_stores_afresh() -> None:
    b, svc = primed()
    svc.drop()
    assert svc.decider.store.kept is None
    result = svc.answer([req("Task: x. ")])[0]
    assert result.reuse == REUSE_STORED
    assert untimed(result) == untimed(fresh(req("Task: x. ")))


def test_store_refuses_a_state_of_another_length() -> None:
    with pytest.raises(ValueError, match="a saved state of 3 tokens cannot be kept for a 2-token prefix"):
        StateStore.last_prefix().store([1, 2], KeptState(data=b"x", n_tokens=3))


# ---------------------------------------------------------------------------------------------
# Exactness: a restored prefix answers what the same prefix computed answers


def test_restored_prefix_equals_fresh_computation() -> None:
    b = ScriptedBackend()
    svc = decide_service(b, keep_prefix=True)
    svc.answer([req("Task: x. ", " First.")])[0]
    r = req("Task: x. ", " Second.")
    restored = svc.answer([r])[0]
    assert restored.reuse == REUSE_RESTORED
    computed = fresh(r)
    assert computed.reuse == REUSE_STORED
    assert restored.scores == computed.scores  # bit for bit


def test_state_stored_after_a_partial_restore_answers_as_when_computed() -> None:
    b = ScriptedBackend()
    svc = decide_service(b, keep_prefix=True)
    svc.answer([req("Task: x. ")])[0]
    grown = req("Task: x. Hello world. ")
    computed = svc.answer([grown])[0]
    assert computed.reuse == REUSE_RESTORED_STORED
    again = svc.answer([grown])[0]
    assert again.reuse == REUSE_RESTORED
    assert again.scores == computed.scores
    # The grown prefix went in as two pieces, so it is not the one-piece fresh answer: the
    # scripted backend, like llama.cpp, rounds by piece. This is why only restores are exact.
    assert computed.scores != fresh(grown).scores


def test_a_request_list_shares_the_kept_state_in_order() -> None:
    requests = [
        req("Task: x. ", id=1),
        req("Task: x. ", " Again.", id=2),
        req("Task: x. Hello world. ", id=3),
        req("Task: x. Hello world. ", id=4, reuse_prefix=False),
    ]
    b = ScriptedBackend()
    svc = decide_service(b, keep_prefix=True)
    results = svc.answer(requests)
    assert [r.id for r in results] == [1, 2, 3, 4]
    assert [r.reuse for r in results] == [REUSE_STORED, REUSE_RESTORED, REUSE_RESTORED_STORED, REUSE_OPTED_OUT]
    one_by_one_b = ScriptedBackend()
    one_by_one_svc = decide_service(one_by_one_b, keep_prefix=True)
    one_by_one = [one_by_one_svc.answer([r])[0] for r in requests]
    assert [untimed(r) for r in results] == [untimed(r) for r in one_by_one]
    assert svc.decider.store.kept is not None
    assert svc.decider.store.kept.tokens == split_prompt(b, requests[2].prefix, requests[2].suffix).prefix_tokens


# ---------------------------------------------------------------------------------------------
# Failures leave the kept state valid and the next decision exact


@pytest.mark.parametrize("where", ["load_state", "prefill", "save_state"])
def test_backend_failure_is_an_error_and_the_cache_stays_usable(where: str) -> None:
    b, svc = primed()
    kept = svc.decider.store.kept
    b.fail_on = where
    result = svc.answer([req("Task: x. Hello world. ")])[0]
    assert result.error == (
        f"decide: the backend failed while running the prompt: ScriptedFailure: scripted failure in {where}"
    )
    assert isinstance(result.cause, ScriptedFailure) and not result.refused
    assert result.scores is None
    assert svc.decider.store.kept is kept  # the failed call stored nothing
    # The kept state still restores exactly: a retry answers as a session that never failed.
    retry = svc.answer([req("Task: x. Hello world. ")])[0]
    clean_b, clean_svc = primed()
    assert untimed(retry) == untimed(clean_svc.answer([req("Task: x. Hello world. ")])[0])


def test_failure_after_the_store_keeps_the_new_valid_state() -> None:
    b = ScriptedBackend()
    svc = decide_service(b, keep_prefix=True)
    r = req("Task: x. ")
    split = split_prompt(b, r.prefix, r.suffix)
    original_prefill = b.prefill
    n_calls = 0

    def fail_second(tokens: Sequence[int], n_past: int) -> PrefillCost:
        nonlocal n_calls
        n_calls += 1
        if n_calls == 2:
            raise ScriptedFailure("rest piece")
        return original_prefill(tokens, n_past)

    b.prefill = fail_second  # type: ignore[method-assign]
    assert svc.answer([r])[0].error is not None
    assert svc.decider.store.kept is not None and svc.decider.store.kept.tokens == split.prefix_tokens
    b.prefill = original_prefill  # type: ignore[method-assign]
    retry = svc.answer([r])[0]
    assert retry.reuse == REUSE_RESTORED
    assert retry.scores == fresh(r).scores


def test_failure_while_preparing_touches_nothing() -> None:
    b, svc = primed()
    kept = svc.decider.store.kept
    b.fail_on = "tokenize_prompt"
    result = svc.answer([req("Task: x. ")])[0]
    assert result.error == (
        "decide: the backend failed while preparing the prompt: ScriptedFailure: scripted failure in tokenize_prompt"
    )
    assert not result.refused
    assert b.calls == [] and svc.decider.store.kept is kept


def test_a_saved_state_of_the_wrong_size_is_not_kept() -> None:
    b, svc = primed()
    kept = svc.decider.store.kept
    b.state_n_tokens_skew = 1
    r = req("Task: y. ")
    n = split_prompt(b, r.prefix, r.suffix).n_prefix
    result = svc.answer([r])[0]
    assert result.error == (
        "decide: the backend failed while running the prompt: ValueError: prefix cache: "
        f"a saved state of {n + 1} tokens cannot be kept for a {n}-token prefix"
    )
    # The request missed the kept prefix, which was dropped before anything was prefilled (a
    # miss replaces it; copying it out of the sequence first would be wasted), and the
    # mis-sized state was refused: nothing is kept.
    assert kept is not None and svc.decider.store.kept is None


# ---------------------------------------------------------------------------------------------
# Reported numbers and the BMOE_DECIDE object


def test_streaming_counters_pass_through() -> None:
    b = ScriptedBackend(streaming=True)
    svc = decide_service(b, keep_prefix=True)
    r = req("Task: x. ")
    split = split_prompt(b, r.prefix, r.suffix)
    result = svc.answer([r])[0]
    assert result.read_mb == 1.5 * split.n_tokens  # summed over both pieces
    assert result.cache_hit_pct == 25.0  # (1 + 1) hits of (4 + 4) lookups
    assert result.prefill_s == 0.25 * split.n_tokens
    out = decide_fields(result)
    assert out["read_mb"] == result.read_mb and out["cache_hit_pct"] == 25.0


def test_cache_hit_pct_is_over_the_request_from_its_own_lookups() -> None:
    """As BMOE_DONE's: hits over lookups summed over the request's own prefills, not the
    session's rate so far (nor its last piece's)."""
    b = ScriptedBackend(streaming=True)
    svc = decide_service(b, keep_prefix=True)
    b.lookups = [(30, 10), (1, 9)]  # the prefix piece, then the rest
    first = svc.answer([req("Task: x. ")])[0]
    assert first.reuse == REUSE_STORED and first.cache_hit_pct == 62.0  # 31 of 50
    b.lookups = [(5, 15)]  # the rest only: the prefix is restored
    second = svc.answer([req("Task: x. ", " Pick two.")])[0]
    assert second.reuse == REUSE_RESTORED and second.cache_hit_pct == 25.0  # the session's: 36 of 70
    b.lookups = [(0, 0)]  # streamed, but nothing was looked up
    assert svc.answer([req("Task: x. ", " Pick three.")])[0].cache_hit_pct == 0.0


def test_cache_hit_pct_is_minus_one_with_the_cache_off_and_absent_resident() -> None:
    off = decide_service(ScriptedBackend(streaming=True, expert_cache=False), keep_prefix=True).answer(
        [req("Task: x. ")]
    )[0]
    assert off.read_mb is not None and off.cache_hit_pct == -1.0 and decide_fields(off)["cache_hit_pct"] == -1.0
    resident = fresh(req("Task: x. "))
    assert resident.cache_hit_pct is None and "cache_hit_pct" not in decide_fields(resident)


def test_prefix_state_mib_is_what_the_backend_holds_not_the_kept_state_alone() -> None:
    """A backend may hold more than the kept state's own bytes (a spare buffer, room to grow):
    the answer reports all of it, after the request."""
    b, svc = primed()
    b.held_bytes = 3 * 2**20 + 2**19
    result = svc.answer([req("Task: x. ", " Pick two.")])[0]
    assert result.reuse == REUSE_RESTORED and svc.decider.store.kept is not None
    assert result.prefix_state_mib == 3.5 != svc.decider.store.kept.state.mib
    b.held_bytes = 0  # the state lives in the sequence, uncopied
    assert svc.answer([req("Task: x. ")])[0].prefix_state_mib == 0.0


def test_to_json_keys() -> None:
    out = decide_fields(fresh(req("Task: x. ")))
    assert list(out) == [
        "id",
        "best",
        "choice_logp",
        "p_outside",
        "abstained",
        "scoring",
        "best_by",
        "n_tokens",
        "n_reused",
        "prefill_s",
        "prefill_tps",
        "prefix_state_mib",
        "store_s",
        "restore_s",
        "reuse",
    ]
    json.dumps(out)


# ---------------------------------------------------------------------------------------------
# The startup policy


@pytest.mark.parametrize(
    ("mode", "prefill_device", "keeps"),
    [
        ("auto", False, True),
        ("auto", True, False),
        ("on", False, True),
        ("on", True, True),
        ("off", False, False),
        ("off", True, False),
    ],
)
def test_prefix_cache_policy(mode: str, prefill_device: bool, keeps: bool) -> None:
    assert resolve_keep_prefix(mode, prefill_device=prefill_device) is keeps


def test_copying_the_kept_state_out_on_clear_is_the_store_of_that_call() -> None:
    b, svc = primed()
    kept = svc.decider.store.kept
    b.clear_copy_s = 0.125
    result = svc.answer([req("Task: y. ", reuse_prefix=False)])[0]
    assert result.reuse == REUSE_OPTED_OUT and result.store_s == 0.125
    assert svc.decider.store.kept is kept  # left alone


def test_a_miss_drops_the_kept_state_before_clearing() -> None:
    b, svc = primed()
    seen: list[object] = []
    clear = b.clear
    b.clear = lambda: (seen.append(svc.decider.store.kept), clear())[1]  # type: ignore[method-assign]
    r = req("Task: y. ")
    result = svc.answer([r])[0]
    assert result.reuse.startswith("miss: prefix differs at token")
    assert seen == [None]  # nothing kept while the sequence was cleared: no copy to make
    assert (
        svc.decider.store.kept is not None
        and svc.decider.store.kept.tokens == split_prompt(b, r.prefix, r.suffix).prefix_tokens
    )


# ---------------------------------------------------------------------------------------------
# Batches: decide_many over a backend that prefills several suffixes together


def sequential(requests: list[DecideRequest], keep_prefix: bool = True) -> tuple[list[DecideResult], PrefixStore]:
    svc = decide_service(ScriptedBackend(), keep_prefix=keep_prefix)
    return svc.answer(requests), svc.decider.store


def scores_of(results: list[DecideResult]) -> list[object]:
    return [(r.id, r.error, r.scores, r.n_tokens) for r in results]


BATCH = [
    req("Task: wifi. ", " Screen 1.", id=1),
    req("Task: wifi. ", " Screen two, longer.", id=2),
    req("Task: bt. ", " Screen 3.", id=3),
    req("Task: wifi. ", " Screen 4!", id=4),
    req("Task: wifi. ", " Screen 5.", id=5, choices=("A", "Apple")),  # refused: first tokens collide
    req("Task: wifi. ", " Screen 6.", id=6, reuse_prefix=False),
]


@pytest.mark.parametrize("cap", [2, 3, 8])
def test_a_batch_answers_what_the_decisions_answer_one_by_one(cap: int) -> None:
    alone, alone_cache = sequential(BATCH)
    b = ScriptedBackend(batch=cap)
    svc = decide_service(b, keep_prefix=True)
    batched = svc.answer(BATCH)
    assert scores_of(batched) == scores_of(alone)
    assert [r.id for r in batched] == [1, 2, 3, 4, 5, 6]  # request order
    assert batched[4].refused and batched[4].batch is None  # refused up front, spoiling nothing
    # the wifi decisions that keep a prefix went in batches of at most cap, after one prefix piece
    sizes = [c[1] for c in b.calls if c[0] == "prefill_batch"]
    assert sum(len(s) for s in sizes) == 3 and all(len(s) <= cap for s in sizes)
    assert [len(s) for s in sizes] == ([2, 1] if cap == 2 else [3])
    assert [r.batch.size if r.batch else None for r in batched] == (
        [2, 2, None, 1, None, None] if cap == 2 else [3, 3, None, 3, None, None]
    )
    assert batched[2].batch is None and batched[5].batch is None  # alone in their group / opted out
    # the state kept at the end is the one the last request left
    assert svc.decider.store.kept is not None and alone_cache.kept is not None
    assert svc.decider.store.kept.tokens == alone_cache.kept.tokens


def test_a_batch_share_adds_up_and_the_first_member_pays_for_the_prefix() -> None:
    b = ScriptedBackend(batch=8, streaming=True)
    b.lookups = [(3, 1), (1, 3)]  # the prefix piece, then the batch
    rs = decide_service(b, keep_prefix=True).answer([BATCH[0], BATCH[1], BATCH[3]])
    assert [r.reuse for r in rs] == [REUSE_STORED, REUSE_RESTORED, REUSE_RESTORED]
    share = rs[0].batch
    assert share is not None and all(r.batch == share for r in rs) and share.size == 3
    suffix_tokens = [r.n_tokens - rs[1].n_reused for r in rs]
    assert share.n_tokens == sum(suffix_tokens)
    assert share.prefill_s == pytest.approx(0.1 * share.n_tokens) and share.read_mb == pytest.approx(
        2.0 * share.n_tokens
    )
    prefix_piece = 0.25 * rs[1].n_reused  # the scripted prefill's cost for the prefix
    assert rs[0].prefill_s == pytest.approx(prefix_piece + 0.1 * suffix_tokens[0])
    assert [r.prefill_s for r in rs[1:]] == pytest.approx([0.1 * n for n in suffix_tokens[1:]])
    assert sum(r.read_mb for r in rs) == pytest.approx(share.read_mb + 1.5 * rs[1].n_reused)
    # the batch's lookups are shared as its reads are: the rate of its share is the batch's (1 in 4),
    # and the first member's prefix piece weighs in with its own (3 in 4)
    assert [r.cache_hit_pct for r in rs[1:]] == pytest.approx([25.0, 25.0])
    s0 = suffix_tokens[0] / share.n_tokens
    assert rs[0].cache_hit_pct == pytest.approx(100.0 * (3 + 1 * s0) / (4 + 4 * s0))
    out = decide_fields(rs[1])
    assert (out["batch_id"], out["batch_size"], out["batch_tokens"]) == (share.id, 3, share.n_tokens)
    assert out["batch_prefill_s"] == share.prefill_s and out["batch_read_mb"] == share.read_mb
    assert "batch_id" not in decide_fields(fresh(BATCH[0]))


def test_a_batch_that_fails_answers_each_member_with_the_error_and_the_rest_go_on() -> None:
    b = ScriptedBackend(batch=8)
    b.fail_on = "prefill_batch"
    rs = decide_service(b, keep_prefix=True).answer(BATCH[:4])
    assert [r.error is not None for r in rs] == [True, True, False, True]
    assert all("scripted failure in prefill_batch" in (r.error or "") for r in (rs[0], rs[1], rs[3]))
    assert rs[2].scores is not None


def test_no_batching_without_the_prefix_cache_or_a_batching_backend() -> None:
    for backend, policy in ((ScriptedBackend(batch=1), ON), (ScriptedBackend(batch=8), OFF)):
        decide_service(backend, keep_prefix=policy.keep_prefix).answer(BATCH)
        assert "prefill_batch" not in backend.touched()


def test_the_sequence_is_told_what_is_kept_whenever_it_changes() -> None:
    """The kept state goes down as an argument (``SequencePort.keep``): stored, extended, dropped
    on a miss before the sequence is cleared (a state that left the store is not worth a copy),
    and dropped with the decider's state."""
    b, svc = primed()
    store = svc.decider.store
    assert store.kept is not None and b.kept == (store.kept,)
    first = store.kept
    assert svc.answer([req("Task: x. More. ")])[0].reuse == REUSE_RESTORED_STORED
    assert store.kept is not first and b.kept == (store.kept,)
    seen: list[tuple] = []
    clear = b.clear
    b.clear = lambda: (seen.append(b.kept), clear())[1]  # type: ignore[method-assign]
    assert svc.answer([req("Other task. ")])[0].reuse.startswith("miss")
    assert seen == [()] and b.kept == (store.kept,)
    svc.drop()
    assert store.kept is None and b.kept == ()
