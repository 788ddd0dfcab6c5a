"""Prompt scoring: the log-probability of every prompt token given the ones before it.

One pass over a token list gives, for each position j >= 1, log p(token j | tokens before j) and
the ``TOP_CAP`` most likely tokens at that position; optionally it then picks one next token.
This is what an OpenAI-style ``/v1/completions`` request with ``echo`` and ``logprobs`` asks for,
and what log-likelihood evaluation (lm-evaluation-harness) reads.

Consecutive requests that share a prefix (one context, several continuations) reuse it twice:
the KV keeps the common token prefix (``KvSequence.align``), and the scores already computed for
that prefix are kept too, so that only the new tail is prefilled. A kept score is a function of
the tokens before it only, so it stays valid whatever else the session did in between. The score
of the first new token comes from the row of the token before it, so reuse stops one token short
of the common prefix (that one token is prefilled again).

Rows are reduced to scores ``ROW_BLOCK`` at a time, so memory stays a few rows of the vocabulary
wide whatever the prompt's length; the prefill itself runs in the same pieces (``n_batch``) as one
``KvSequence.append`` of the whole tail would.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from bmoe.errors import ContextOverflowError, RequestError
from bmoe.llama.model import LlamaModel
from bmoe.numerics import common_prefix_len, log_softmax
from bmoe.rules import TOP_CAP
from bmoe.runtime.kv import KvSequence
from bmoe.runtime.results import ScoreRequest, ScoreResult
from bmoe.runtime.sampling import LOGPROB_FLOOR, Sampler, TokenLogprobs, check_sampling

ROW_BLOCK = 32  # logit rows turned into float64 log-probabilities at a time


def row_logprobs(logits: np.ndarray, targets: np.ndarray, top_k: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Score logit rows: ``logits  # [m, n_vocab]`` float32, ``targets  # [m]`` (-1: none).

    Returns ``(target_lp  # [m] float64, nan where no target; top_ids  # [m, top_k] int64;
    top_lp  # [m, top_k] float64)``, the top tokens most likely first (ties: lower id first). The
    one log-softmax (``bmoe.numerics``) makes these values comparable bit for bit with perplexity.
    """
    m = len(logits)
    target_lp = np.full(m, np.nan)
    top_ids = np.zeros((m, top_k), dtype=np.int64)
    top_lp = np.zeros((m, top_k))
    for b in range(0, m, ROW_BLOCK):
        lp = log_softmax(logits[b : b + ROW_BLOCK])  # [rows, n_vocab] float64
        rows = np.arange(len(lp))
        t = targets[b : b + ROW_BLOCK]
        has = t >= 0
        target_lp[b : b + len(lp)][has] = lp[rows[has], t[has]]
        if top_k:
            cand = np.argpartition(-lp, top_k - 1, axis=-1)[:, :top_k]
            vals = np.take_along_axis(lp, cand, axis=-1)
            order = np.lexsort((cand, -vals), axis=-1)  # by value descending, then id ascending
            top_ids[b : b + len(lp)] = np.take_along_axis(cand, order, axis=-1)
            top_lp[b : b + len(lp)] = np.take_along_axis(vals, order, axis=-1)
    return target_lp, top_ids, top_lp


def token_logprobs(logits: np.ndarray, token: int, top_n: int) -> TokenLogprobs:
    """``logits  # [n_vocab]`` float32, the row ``token`` was chosen from: the one row reduction
    prompt scoring uses (``scoring.row_logprobs``), floored for JSON."""
    target, top_ids, top_lp = row_logprobs(logits[None, :], np.array([token]), min(top_n, len(logits)))
    ids = tuple(int(t) for t in top_ids[0])
    vals = tuple(max(LOGPROB_FLOOR, float(v)) for v in top_lp[0])
    return TokenLogprobs(max(LOGPROB_FLOOR, float(target[0])), ids, vals)


def check_token_ids(tokens: Sequence[int], n_vocab: int, field: str = "tokens") -> None:
    """RequestError naming the first id that is not one of the model's (a larger one would wrap in
    llama.cpp's int32 batch and score another token)."""
    bad = next(
        (
            i
            for i, t in enumerate(tokens)
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < n_vocab
        ),
        None,
    )
    if bad is not None:
        raise RequestError(f"{field}.{bad}: {tokens[bad]!r} is not a token id of this model (0..{n_vocab - 1})")


class PromptScorer:
    """Scores token lists on the session's KV, keeping the scores of the last one for the next."""

    def __init__(self, kv: KvSequence, model: LlamaModel) -> None:
        self.kv = kv
        self.model = model
        # The kept scores: position j of ``_tokens`` (j >= 1) scored as _lp[j], _top_*[j].
        self._tokens: list[int] = []
        self._lp = np.zeros(0)
        self._top_ids = np.zeros((0, TOP_CAP), dtype=np.int64)
        self._top_lp = np.zeros((0, TOP_CAP))

    def check(self, req: ScoreRequest) -> None:
        """Refuse a request (RequestError) before anything in the KV changes."""
        n, n_vocab = len(req.tokens), self.model.n_vocab
        if n == 0:
            raise RequestError("tokens: is empty; give at least one token")
        check_token_ids(req.tokens, n_vocab)
        if req.n_predict not in (0, 1):
            raise RequestError(f"n_predict: prompt scoring picks 0 or 1 token, got {req.n_predict}")
        if not 0 <= req.top_n <= TOP_CAP:  # a row keeps TOP_CAP alternatives
            raise RequestError(f"top_n: at most {TOP_CAP} alternatives per position, got {req.top_n}")
        check_sampling(None, req.logit_bias, n_vocab)
        if n + req.n_predict > self.kv.ctx.n_ctx:
            raise ContextOverflowError(
                f"tokens: {n} tokens, plus {req.n_predict} to pick, do not fit the context (n_ctx {self.kv.ctx.n_ctx})"
            )

    def score(self, req: ScoreRequest) -> ScoreResult:
        self.check(req)
        toks = list(req.tokens)
        n_tok = len(toks)
        kept = common_prefix_len(self._tokens, toks)  # kept scores are valid for positions 1..kept-1
        plan = self.kv.align(toks, reuse=req.reuse)
        n_reused, fallback = plan.n_reused, plan.fallback
        if req.echo and n_reused > max(kept - 1, 0):
            # the first prefilled token's score needs the row before it: keep only scored positions
            target = max(kept - 1, 0)
            self.kv.rollback(target)
            n_reused = self.kv.n_past
            if n_reused != target:
                fallback = f"memory cannot be trimmed to {target} tokens (recurrent layers): full prefill"
        lp = np.full(n_tok, np.nan)
        top_ids = np.zeros((n_tok, TOP_CAP), dtype=np.int64)
        top_lp = np.zeros((n_tok, TOP_CAP))
        t0 = time.perf_counter()
        last: np.ndarray | None
        if req.echo:
            lp[1 : n_reused + 1] = self._lp[1 : n_reused + 1]
            top_ids[1 : n_reused + 1] = self._top_ids[1 : n_reused + 1]
            top_lp[1 : n_reused + 1] = self._top_lp[1 : n_reused + 1]
            last = self._prefill_scored(toks, n_reused, lp, top_ids, top_lp)
        else:
            last = self.kv.append(toks[n_reused:], logits="last" if req.n_predict else "none")
        prefill_s = time.perf_counter() - t0
        # Keep what is now known: every position after an echo, else the still valid prefix.
        n_keep = n_tok if req.echo else min(kept, len(self._tokens))
        self._tokens = toks[:n_keep]
        self._lp, self._top_ids, self._top_lp = (
            (lp, top_ids, top_lp) if req.echo else (self._lp[:n_keep], self._top_ids[:n_keep], self._top_lp[:n_keep])
        )
        generated: tuple[int, ...] = ()
        gen_lp = np.zeros(0)
        gen_ids, gen_top = np.zeros((0, req.top_n), dtype=np.int64), np.zeros((0, req.top_n))
        if req.n_predict:
            assert last is not None
            tok = Sampler(req.temperature, req.top_p, req.seed, req.logit_bias).sample(last)
            g_lp, g_ids, g_top = row_logprobs(last[None, :], np.array([tok]), req.top_n)
            generated, gen_lp, gen_ids, gen_top = (tok,), g_lp, g_ids, g_top
        return ScoreResult(
            tokens=tuple(toks) + generated,
            n_prompt=n_tok,
            token_logprobs=np.concatenate([lp if req.echo else np.full(n_tok, np.nan), gen_lp]),
            top_ids=np.concatenate([top_ids[:, : req.top_n], gen_ids]),
            top_logprobs=np.concatenate([top_lp[:, : req.top_n], gen_top]),
            generated=generated,
            eog=bool(generated) and self.model.is_eog(generated[0]),
            n_reused=n_reused,
            n_prefilled=n_tok - n_reused,
            prefill_s=prefill_s,
            prefill_fallback=fallback,
        )

    def _prefill_scored(
        self, toks: list[int], start: int, lp: np.ndarray, top_ids: np.ndarray, top_lp: np.ndarray
    ) -> np.ndarray:
        """Prefill ``toks[start:]`` (n_batch tokens per call, as one append would) and fill in the
        scores of positions start+1..; returns the last row's logits ``# [n_vocab]``."""
        n_batch = self.kv.ctx.n_batch
        targets = np.asarray(toks[1:] + [-1], dtype=np.int64)  # row i predicts token i+1
        last = None
        for b in range(start, len(toks), n_batch):
            rows = self.kv.append(toks[b : b + n_batch], logits="all")  # [m, n_vocab]
            assert rows is not None
            m = len(rows)
            t_lp, t_ids, t_top = row_logprobs(rows, targets[b : b + m], TOP_CAP)
            # row b+i scores token b+i+1; the last row (the next token) has no prompt position
            k = min(m, len(toks) - 1 - b)
            lp[b + 1 : b + 1 + k] = t_lp[:k]
            top_ids[b + 1 : b + 1 + k] = t_ids[:k]
            top_lp[b + 1 : b + 1 + k] = t_top[:k]
            last = rows[-1]
        assert last is not None
        return last
