"""Perplexity over a text with a sliding window.

Windows of n_window tokens advance by half a window; each token is scored once, by the
first window that sees it with context (the first window scores all but its first token,
later ones only their second half), like llama-perplexity's strided evaluation. Each window
is prefilled into an empty KV, so results do not depend on what the session did before; it is
prefilled and scored n_batch tokens at a time, so the logits held at once are one piece's
(``# [n_batch, n_vocab]``), not the window's.
"""

from __future__ import annotations

import math

import numpy as np

from bmoe.errors import RequestError
from bmoe.runtime.kv import KvSequence
from bmoe.runtime.results import PerplexityResult
from bmoe.runtime.scoring import row_logprobs


def perplexity(kv: KvSequence, tokens: list[int], n_window: int, *, keep_logits: bool = False) -> PerplexityResult:
    if isinstance(n_window, bool) or not isinstance(n_window, int) or not 2 <= n_window <= kv.ctx.n_ctx:
        raise RequestError(f"n_window: must be an integer in [2, n_ctx {kv.ctx.n_ctx}], got {n_window!r}")
    if len(tokens) < 2:
        raise RequestError(f"text: perplexity needs at least 2 tokens, got {len(tokens)}")
    stride = max(1, n_window // 2)
    logps: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    scored_to = 1  # next token index that still needs a score (token 0 has no context)
    begin = 0
    n_batch = kv.ctx.n_batch
    while scored_to < len(tokens):
        end = min(begin + n_window, len(tokens))
        kv.reset()
        # In n_batch pieces, as one append of the window would feed llama.cpp (the same calls, the
        # same rows asked for, so the same numbers), and each piece's rows scored before the next
        # is decoded: a window's logits are never all held at once (n_ctx 4096 with a 152k
        # vocabulary is 2.5 GB of them), only one piece's.
        for at in range(begin, end, n_batch):
            piece = kv.append(tokens[at : min(at + n_batch, end)], logits="all")  # [m, n_vocab]
            assert piece is not None
            # row i of the piece predicts token at+i+1; score those in scored_to..end-1
            lo, hi = max(scored_to, at + 1), min(end, at + len(piece) + 1)
            if lo >= hi:
                continue
            kept = piece[lo - at - 1 : hi - at - 1]
            logps.append(row_logprobs(kept, np.asarray(tokens[lo:hi], dtype=np.int64))[0])
            if keep_logits:
                rows.append(kept.copy())  # not a view: it would keep the whole piece alive
            del piece, kept
        scored_to = end
        begin += stride
    kv.reset()
    token_logprobs = np.concatenate(logps)
    nll = float(-token_logprobs.mean())
    return PerplexityResult(
        ppl=math.exp(nll),
        nll_mean=nll,
        n_scored=len(token_logprobs),
        n_window=n_window,
        token_logprobs=token_logprobs,
        logits=np.concatenate(rows) if keep_logits else None,
    )
