"""Session.score: per-position log-probs of a prompt, the reused prefix (KV and kept scores), what
is exact, the hybrid fallback, refusals. On the tiny Q8_0 models (a few seconds)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bmoe.errors import ContextOverflowError, RequestError
from bmoe.numerics import log_softmax
from bmoe.rules import TOP_CAP
from bmoe.runtime.results import GenerateRequest, ScoreRequest
from bmoe.runtime.scoring import row_logprobs
from bmoe.session import Session

# Reused prefix + new tail against the prompt prefilled whole: not the same pieces, so a tolerance
# (docs/server.md "What is exact"). With flash attention off both sides measured bit-equal on the
# tiny Q8_0 model and on SmolLM2 (AVX2 and AVX-512 builds); K-quants differ up to 0.93 nats.
REUSE_TOL = 0.05


@pytest.fixture()
def open_tiny(open_tiny):
    """The engine tests' fixture, with a smaller context and flash attention off (REUSE_TOL's premise)."""
    return lambda arch="qwen3moe", **kw: open_tiny(arch, **{"n_ctx": 256, "flash_attn": False, **kw})


def random_tokens(s: Session, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(s.model.n_vocab) for _ in range(n)]


def test_scores_without_reuse_equal_perplexity_bit_for_bit(open_tiny) -> None:
    """Same pieces: both prefill the tokens into an empty KV in one append and take the one
    log-softmax of each row."""
    s = open_tiny()
    toks = random_tokens(s, 40, 1)
    r = s.score(ScoreRequest(tokens=tuple(toks), top_n=5, reuse=False))
    p = s.perplexity(tokens=toks)
    assert r.n_reused == 0 and r.n_prefilled == 40 and r.generated == ()
    assert np.isnan(r.token_logprobs[0]) and np.array_equal(r.token_logprobs[1:], p.token_logprobs)
    # the top 5 come from the same rows: most likely first, and the prompt's own token never beats the best
    assert r.top_ids.shape == (40, 5) and np.all(np.diff(r.top_logprobs[1:], axis=1) <= 0)
    assert np.all(r.token_logprobs[1:] <= r.top_logprobs[1:, 0])
    hits = r.top_ids[1:] == np.asarray(toks[1:])[:, None]
    assert np.array_equal(r.top_logprobs[1:][hits], r.token_logprobs[1:][hits.any(axis=1)])


def test_row_logprobs_top_order_and_ties() -> None:
    logits = np.array([[0.0, 2.0, 2.0, -1.0, 1.0], [5.0, 0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    lp, ids, top = row_logprobs(logits, np.array([4, -1]), 3)
    ref = log_softmax(logits)
    assert lp[0] == ref[0, 4] and np.isnan(lp[1])
    assert ids.tolist() == [[1, 2, 4], [0, 1, 2]]  # a tie goes to the lower id
    assert np.array_equal(top, np.take_along_axis(ref, ids, axis=1))


def test_reuse_keeps_the_prefix_and_its_scores(open_tiny) -> None:
    """One context, two continuations: the second request prefills only past the common prefix,
    less one token (its score needs the row before it). Its kept positions are the first
    request's values; its new tail equals a fresh session fed the same pieces by hand (the first
    prompt whole, trimmed to the reused prefix, then the tail), bit for bit."""
    s = open_tiny()
    ctx = random_tokens(s, 30, 2)
    a, b = ctx + [11, 12, 13], ctx + [21, 22]
    r1 = s.score(ScoreRequest(tokens=tuple(a), top_n=2))
    r2 = s.score(ScoreRequest(tokens=tuple(b), top_n=2))
    n = len(ctx) - 1
    assert (r2.n_reused, r2.n_prefilled, r2.prefill_fallback) == (n, len(b) - n, "")
    assert np.array_equal(r2.token_logprobs[1 : n + 1], r1.token_logprobs[1 : n + 1])
    assert np.array_equal(r2.top_ids[: n + 1], r1.top_ids[: n + 1])

    same = open_tiny()
    same.kv.append(a, logits="all")
    same.kv.rollback(n)
    rows = same.kv.append(b[n:], logits="all")
    lp, ids, _ = row_logprobs(rows[:-1], np.asarray(b[n + 1 :]), 2)
    assert np.array_equal(r2.token_logprobs[n + 1 :], lp) and np.array_equal(r2.top_ids[n + 1 :], ids)


def test_any_request_sequence_scores_as_the_prompt_prefilled_whole(open_tiny) -> None:
    """Echo on and off, a picked token, a chat turn and a perplexity pass in between (which move
    the KV but not the kept scores): every answer agrees with reuse=False within REUSE_TOL."""
    s = open_tiny(decide=True)
    ctx = random_tokens(s, 50, 3)
    rng = random.Random(4)
    compared = 0  # requests that reused a prefix
    for k in range(14):
        toks = ctx[: rng.randrange(5, 50)] + random_tokens(s, rng.randrange(1, 6), 100 + k)
        if k % 5 == 3:
            s.generate(GenerateRequest(prompt="hello", n_predict=2))
        if k % 7 == 5:
            s.perplexity(tokens=ctx[:20])
        echo = k % 4 != 1
        req = ScoreRequest(tokens=tuple(toks), echo=echo, top_n=3, n_predict=k % 2)
        got = s.score(req)
        assert got.n_reused + got.n_prefilled == len(toks)
        compared += got.n_reused > 0
        whole = s.score(ScoreRequest(tokens=req.tokens, echo=True, top_n=3, n_predict=k % 2, reuse=False))
        assert whole.n_reused == 0 and got.generated == whole.generated
        pos = slice(1, None) if echo else slice(len(toks), None)
        np.testing.assert_allclose(got.token_logprobs[pos], whole.token_logprobs[pos], atol=REUSE_TOL, rtol=0)
        np.testing.assert_allclose(got.top_logprobs[pos], whole.top_logprobs[pos], atol=REUSE_TOL, rtol=0)
        if not echo:
            assert np.isnan(got.token_logprobs[: len(toks)]).all()
        s.score(req)  # leave the KV and the kept scores holding this prompt for the next one
    assert compared >= 8  # most requests did reuse a prefix


def test_the_picked_token(open_tiny) -> None:
    s = open_tiny()
    toks = random_tokens(s, 12, 5)
    r = s.score(ScoreRequest(tokens=tuple(toks), echo=False, top_n=4, n_predict=1))
    last = s.next_token_logprobs(toks)
    assert r.generated == (int(np.argmax(last)),) and r.tokens == tuple(toks) + r.generated
    assert r.token_logprobs[-1] == r.top_logprobs[-1, 0] and r.top_ids[-1, 0] == r.generated[0]
    np.testing.assert_allclose(r.token_logprobs[-1], last.max(), atol=REUSE_TOL)
    sampled = {
        s.score(ScoreRequest(tokens=tuple(toks), echo=False, n_predict=1, temperature=1.5, seed=k)).generated
        for k in range(6)
    }
    assert len(sampled) > 1  # temperature and seed reach the pick


def test_hybrid_model_cannot_trim_and_prefills_whole(open_tiny) -> None:
    """qwen35moe's recurrent layers cannot be cut back: a request sharing a prefix is prefilled
    whole, says why, and is then the same pieces as reuse=False: bit for bit."""
    s = open_tiny("qwen35moe")
    ctx = random_tokens(s, 20, 6)
    s.score(ScoreRequest(tokens=tuple(ctx + [7, 8])))
    r = s.score(ScoreRequest(tokens=tuple(ctx + [9]), top_n=1))
    assert r.n_reused == 0 and "recurrent" in r.prefill_fallback
    w = s.score(ScoreRequest(tokens=tuple(ctx + [9]), top_n=1, reuse=False))
    assert np.array_equal(r.token_logprobs, w.token_logprobs, equal_nan=True)
    # a prompt extending the previous one: the KV need not be cut, but the kept scores stop one
    # token short of it, and the state cannot be cut back that one token either
    longer = s.score(ScoreRequest(tokens=tuple(ctx + [9, 10]), top_n=1))
    assert longer.n_reused == 0 and "recurrent" in longer.prefill_fallback
    w2 = s.score(ScoreRequest(tokens=tuple(ctx + [9, 10]), top_n=1, reuse=False))
    assert np.array_equal(longer.token_logprobs, w2.token_logprobs, equal_nan=True)


@pytest.mark.parametrize(
    "req, match",
    [
        (ScoreRequest(tokens=()), "tokens: is empty"),
        (ScoreRequest(tokens=(1, -1)), r"tokens.1: -1 is not a token id"),
        (ScoreRequest(tokens=(1, 10**9)), r"tokens.1: 1000000000 is not a token id"),
        (ScoreRequest(tokens=(1, 2), n_predict=2), "n_predict: prompt scoring picks 0 or 1 token, got 2"),
        (ScoreRequest(tokens=(1, 2), top_n=TOP_CAP + 1), f"top_n: at most {TOP_CAP} alternatives"),
    ],
)
def test_refusals_change_nothing(open_tiny, req, match) -> None:
    s = open_tiny()
    toks = tuple(random_tokens(s, 10, 7))
    before = s.score(ScoreRequest(tokens=toks, top_n=1))
    kv = list(s.kv.tokens)
    with pytest.raises(RequestError, match=match):
        s.score(req)
    assert s.kv.tokens == kv
    again = s.score(ScoreRequest(tokens=toks, top_n=1))
    assert np.array_equal(again.token_logprobs, before.token_logprobs, equal_nan=True)


def test_too_long_is_a_context_overflow(open_tiny) -> None:
    s = open_tiny(n_ctx=64)
    n = s.n_ctx  # llama.cpp may round the context up
    with pytest.raises(
        ContextOverflowError, match=rf"tokens: {n} tokens, plus 1 to pick, do not fit the context \(n_ctx {n}\)"
    ):
        s.score(ScoreRequest(tokens=tuple(random_tokens(s, n, 8)), n_predict=1))
    assert s.score(ScoreRequest(tokens=tuple(random_tokens(s, n, 8)))).n_prefilled == n


def test_decide_state_is_dropped_as_for_a_generation(open_tiny) -> None:
    """A scoring request moves the KV like a generation does, and leaves the next decision in
    the same position: the kept prefix state dropped, the decision answered as after a chat turn."""
    from bmoe.decide.types import DecideRequest

    d = DecideRequest(id=1, prefix="Some prefix text here. ", suffix="A or B?", choices=("A", "B"))
    after = []
    for between in (
        lambda s: s.generate(GenerateRequest(prompt="hi", n_predict=2)),
        lambda s: s.score(ScoreRequest(tokens=tuple(random_tokens(s, 8, 9)))),
    ):
        s = open_tiny(decide=True)
        assert s.decide(d).reuse == "stored"
        between(s)
        r = s.decide(d)
        assert r.error is None
        after.append((r.reuse, r.n_reused, r.n_tokens))
    assert after[0] == after[1] and after[0][0] != "restored"
