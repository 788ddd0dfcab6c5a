"""Session.perplexity on the tiny Q8_0 model: scored in n_batch pieces with the numbers of one
whole-window prefill, the logits held at once bounded by a piece, and n_window's refusals."""

from __future__ import annotations

import random
import tracemalloc

import numpy as np
import pytest

from bmoe.errors import RequestError
from bmoe.runtime.results import GenerateRequest
from bmoe.runtime.scoring import row_logprobs
from bmoe.session import Session


def random_tokens(s: Session, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(s.model.n_vocab) for _ in range(n)]


def whole_windows(s: Session, toks: list[int], n_window: int) -> tuple[np.ndarray, np.ndarray]:
    """The computation perplexity() did before it scored in pieces: each window prefilled into an
    empty KV by one append asking every row, all of its rows held, then scored."""
    kv = s.runtime.kv
    lps, rows = [], []
    scored_to, begin = 1, 0
    while scored_to < len(toks):
        end = min(begin + n_window, len(toks))
        kv.reset()
        logits = kv.append(toks[begin:end], logits="all")
        first = scored_to - begin - 1
        lps.append(row_logprobs(logits[first : end - begin - 1], np.asarray(toks[scored_to:end]))[0])
        rows.append(logits[first : end - begin - 1])
        scored_to, begin = end, begin + n_window // 2
    kv.reset()
    return np.concatenate(lps), np.concatenate(rows)


@pytest.mark.parametrize("n_window", [100, 128, 37])
def test_pieces_score_what_the_whole_window_scored_bit_for_bit(open_tiny, n_window: int) -> None:
    """Same pieces, so bit for bit: both sides prefill each window into an empty KV in the same
    llama_decode calls (one append feeds n_batch tokens per call, and the pieces start at the
    window's first token, every n_batch), every row asked for, and reduce each row with the one
    log-softmax. Windows of 100 and 37 end inside a piece; 128 on a piece boundary."""
    s = open_tiny(n_batch=32)
    toks = random_tokens(s, 300, 3)
    p = s.perplexity(tokens=toks, n_window=n_window, keep_logits=True)
    lp, rows = whole_windows(s, toks, n_window)
    assert p.n_scored == len(toks) - 1 == len(lp)
    assert np.array_equal(p.token_logprobs, lp) and np.array_equal(p.logits, rows)
    assert p.nll_mean == float(-lp.mean())
    assert s.kv.tokens == []  # left empty, as before


def test_the_logits_held_at_once_are_one_pieces_not_the_windows(open_tiny) -> None:
    """A window of n_ctx 512 tokens with n_batch 64: every append returns at most 64 rows (the seam
    where a window's logits come from), and the peak of traced allocations stays under one
    window's logits (before: two whole copies of them, the row list and its stack)."""
    s = open_tiny(n_batch=64)
    toks = random_tokens(s, 600, 4)
    kv = s.runtime.kv
    append, widest = kv.append, []

    def counting(tokens, **kw):  # noqa: ANN001, ANN202
        out = append(tokens, **kw)
        widest.append(0 if out is None else len(out) if out.ndim == 2 else 1)
        return out

    kv.append = counting  # type: ignore[method-assign]
    window_bytes = 512 * s.model.n_vocab * 4
    tracemalloc.start()
    try:
        p = s.perplexity(tokens=toks, n_window=512)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert p.n_scored == 599 and max(widest) == 64
    assert peak < window_bytes, f"peak {peak / 2**20:.0f} MiB, one window's logits {window_bytes / 2**20:.0f} MiB"


@pytest.mark.parametrize("n_window", [0, -4, 1, 513, True, 2.5])
def test_n_window_out_of_range_is_refused_and_the_session_goes_on(open_tiny, n_window) -> None:
    """0 was taken as "the whole context" (``n_window or n_ctx``); now only None is, and 0 is
    refused like any other window llama.cpp cannot take, before the KV changes."""
    s = open_tiny()
    s.generate(GenerateRequest(prompt="Hello", n_predict=2))
    held = list(s.kv.tokens)
    with pytest.raises(RequestError, match=rf"^n_window: must be an integer in \[2, n_ctx 512\], got {n_window!r}$"):
        s.perplexity("some text to score", n_window=n_window)
    assert s.kv.tokens == held
    assert s.perplexity("some text to score").n_window == 512  # None: the whole context
    assert s.generate(GenerateRequest(prompt="Hello", n_predict=2)).n_tokens == 2
