"""Perplexity over a text with a sliding window.

Windows of n_window tokens advance by half a window; each token is scored once, by the
first window that sees it with context (the first window scores all but its first token,
later ones only their second half), like llama-perplexity's strided evaluation. Each window
is prefilled into an empty KV, so results do not depend on what the session did before.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import RequestError
from .kv import KvCache
from .results import PerplexityResult
from .scoring import row_logprobs


def perplexity(kv: KvCache, tokens: list[int], n_window: int, *, keep_logits: bool = False) -> PerplexityResult:
    if isinstance(n_window, bool) or not isinstance(n_window, int) or not 2 <= n_window <= kv.ctx.n_ctx:
        raise RequestError(f"n_window: must be an integer in [2, n_ctx {kv.ctx.n_ctx}], got {n_window!r}")
    if len(tokens) < 2:
        raise RequestError(f"text: perplexity needs at least 2 tokens, got {len(tokens)}")
    stride = max(1, n_window // 2)
    logps: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    scored_to = 1  # next token index that still needs a score (token 0 has no context)
    begin = 0
    while scored_to < len(tokens):
        end = min(begin + n_window, len(tokens))
        kv.reset()
        logits = kv.append(tokens[begin:end], logits="all")  # [end-begin, n_vocab]
        # logits row j predicts token begin+j+1
        first = scored_to - begin - 1
        targets = np.asarray(tokens[scored_to:end], dtype=np.int64)
        logps.append(row_logprobs(logits[first : end - begin - 1], targets)[0])
        if keep_logits:
            rows.append(logits[first : end - begin - 1])
        scored_to = end
        begin += stride
    kv.reset()
    token_logprobs = np.concatenate(logps)
    nll = float(-token_logprobs.mean())
    return PerplexityResult(
        ppl=math.exp(nll), nll_mean=nll, n_scored=len(token_logprobs), n_window=n_window,
        token_logprobs=token_logprobs, logits=np.concatenate(rows) if keep_logits else None,
    )
