"""Token choice from one logit row: greedy (argmax) or temperature + top-p with a seed."""

from __future__ import annotations

import numpy as np

from bmoe.numerics import log_softmax


class Sampler:
    def __init__(self, temperature: float, top_p: float, seed: int | None) -> None:
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self._rng = np.random.default_rng(seed)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def sample(self, logits: np.ndarray) -> int:
        """``logits  # [n_vocab]`` float32 -> token id."""
        if self.greedy:
            return int(np.argmax(logits))
        # In float64, from the top logit down: a tiny temperature then sends every other logit to
        # -inf rather than the top ones to +inf (inf - inf is NaN).
        x = np.asarray(logits, dtype=np.float64)
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
