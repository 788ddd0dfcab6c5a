"""Sampling from one logit row: every temperature the requests allow gives a token, never NaN."""

from __future__ import annotations

import numpy as np
import pytest

from bmoe.runtime.sampling import Sampler


@pytest.mark.parametrize("temperature", [1e-40, 1e-30, 1e-6, 0.5, 1.0, 2.0, 10.0])
def test_every_allowed_temperature_gives_a_token(temperature: float) -> None:
    logits = np.array([3.0, 9.5, -2.0, 9.5 - 1e-3, 0.0], dtype=np.float32)
    tok = Sampler(temperature, 1.0, seed=0).sample(logits)
    assert 0 <= tok < len(logits)
    if temperature <= 1e-6:  # next to greedy: the top logit
        assert tok == 1


def test_the_same_seed_gives_the_same_tokens_and_top_p_keeps_the_head() -> None:
    rng = np.random.default_rng(7)
    rows = [rng.normal(size=64).astype(np.float32) for _ in range(20)]
    a, b = Sampler(0.8, 0.9, seed=3), Sampler(0.8, 0.9, seed=3)
    assert [a.sample(r) for r in rows] == [b.sample(r) for r in rows]
    narrow = Sampler(1.0, 1e-9, seed=1)  # top_p so small that only the most likely token is left
    assert all(narrow.sample(r) == int(np.argmax(r)) for r in rows)
