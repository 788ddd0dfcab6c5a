"""Token choice from one logit row: greedy (argmax) or temperature + top-p with a seed, after an
optional logit bias; and the log-probs a chat answer reports for the chosen token."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bmoe.errors import RequestError
from bmoe.numerics import log_softmax
from bmoe.rules import BIAS_MAX, TOP_CAP

LOGPROB_FLOOR = -9999.0  # what a log-prob of -inf is reported as (JSON has no -inf); OpenAI's floor


def check_sampling(top_logprobs: int | None, logit_bias: Sequence[tuple[int, float]], n_vocab: int) -> None:
    """RequestError naming what is wrong with a generate request's log-probs or logit bias."""
    if top_logprobs is not None and not 0 <= top_logprobs <= TOP_CAP:
        raise RequestError(f"top_logprobs: {top_logprobs} is not in 0..{TOP_CAP}")
    for tok, bias in logit_bias:
        if not 0 <= tok < n_vocab:
            raise RequestError(f"logit_bias: {tok} is not a token id of this model (0..{n_vocab - 1})")
        if not -BIAS_MAX <= bias <= BIAS_MAX:  # NaN too
            raise RequestError(f"logit_bias: token {tok}'s bias {bias} is not in [{-BIAS_MAX:g}, {BIAS_MAX:g}]")


class Sampler:
    """Picks each token of one answer. The presence and frequency penalties are OpenAI's: a token
    already in the answer (``taken``) has its logit lowered by ``presence`` once and by
    ``frequency`` for each time it was taken; the prompt's tokens do not count."""

    def __init__(
        self,
        temperature: float,
        top_p: float,
        seed: int | None,
        bias: Sequence[tuple[int, float]] = (),
        presence: float = 0.0,
        frequency: float = 0.0,
    ) -> None:
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self._rng = np.random.default_rng(seed)
        self._bias_ids = np.array([t for t, _ in bias], dtype=np.int64)
        self._bias = np.array([b for _, b in bias], dtype=np.float32)
        self._presence, self._frequency = float(presence), float(frequency)
        self._counts: dict[int, int] = {}

    def taken(self, tok: int) -> None:
        """``tok`` is the answer's next token (sampled or forced): later penalties count it."""
        if self._presence or self._frequency:
            self._counts[tok] = self._counts.get(tok, 0) + 1

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def sample(self, logits: np.ndarray) -> int:
        """``logits  # [n_vocab]`` float32 -> token id. The bias and the penalties go on one copy:
        the row the caller holds stays the model's."""
        if len(self._bias_ids) or self._counts:
            logits = np.array(logits, dtype=np.float32)
        if len(self._bias_ids):
            np.add.at(logits, self._bias_ids, self._bias)
        if self._counts:
            ids = np.fromiter(self._counts, dtype=np.int64, count=len(self._counts))
            n = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
            logits[ids] -= np.float32(self._presence) + np.float32(self._frequency) * n
        if self.greedy:
            return int(np.argmax(logits))
        # In float64, from the top logit down: a tiny temperature then sends every other logit to
        # -inf rather than the top ones to +inf (inf - inf is NaN).
        x = np.asarray(logits, dtype=np.float64)
        with np.errstate(over="ignore"):  # that overflow to -inf is the intent, not a fault
            p = np.exp(log_softmax((x - x.max()) / self.temperature))
        if self.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
            keep = order[: int(np.searchsorted(cum, self.top_p) + 1)]
            mask = np.zeros_like(p)
            mask[keep] = p[keep]
            p = mask
        p = p / p.sum()
        return int(self._rng.choice(len(p), p=p))


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """The chosen token's log-prob and the ``top_n`` most likely tokens (most likely first, ties
    by lower id) in the model's own distribution at that position: the log-softmax of the raw
    logit row, before bias, temperature and top-p."""

    logprob: float
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]
