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


def test_logit_bias_bans_and_forces_and_leaves_the_row_alone() -> None:
    row = np.array([0.0, 5.0, 1.0, 4.9], dtype=np.float32)
    assert Sampler(0.0, 1.0, None, ((1, -100.0),)).sample(row) == 3
    assert Sampler(0.0, 1.0, None, ((2, 100.0),)).sample(row) == 2
    assert Sampler(1.0, 1.0, 7, ((1, -100.0), (3, -100.0))).sample(row) in (0, 2)
    assert row[1] == 5.0  # the caller's row is the model's


def test_token_logprobs_are_the_models_most_likely_first() -> None:
    from bmoe.numerics import log_softmax
    from bmoe.runtime.scoring import token_logprobs

    row = np.array([1.0, 3.0, 3.0, -2.0], dtype=np.float32)
    lp = log_softmax(row)
    got = token_logprobs(row, 3, 3)
    assert got.logprob == float(lp[3])
    assert got.top_ids == (1, 2, 0)  # ties: the lower id first
    assert got.top_logprobs == tuple(float(lp[t]) for t in (1, 2, 0))
    assert token_logprobs(row, 0, 0).top_ids == ()
    assert len(token_logprobs(row, 0, 20).top_ids) == 4  # no more than the vocabulary


def test_check_sampling_names_the_field() -> None:
    from bmoe.errors import RequestError
    from bmoe.runtime.sampling import check_sampling

    with pytest.raises(RequestError, match=r"^logit_bias: 10 is not a token id of this model \(0\.\.9\)$"):
        check_sampling(None, ((10, 1.0),), 10)
    with pytest.raises(RequestError, match=r"^logit_bias: token 3's bias nan is not in \[-100, 100\]$"):
        check_sampling(None, ((3, float("nan")),), 10)
    with pytest.raises(RequestError, match=r"^top_logprobs: 21 is not in 0\.\.20$"):
        check_sampling(21, (), 10)


def test_penalties_count_the_answers_tokens_only() -> None:
    """OpenAI's rule: logit - presence * (taken at all) - frequency * (times taken)."""
    row = np.array([0.0, 5.0, 4.0, 3.5], dtype=np.float32)
    s = Sampler(0.0, 1.0, None, presence=0.6, frequency=0.3)
    assert s.sample(row) == 1  # nothing taken yet: no penalty
    s.taken(1)  # 5.0 - 0.6 - 0.3 = 4.1 still beats 4.0
    assert s.sample(row) == 1
    s.taken(1)  # 5.0 - 0.6 - 0.6 = 3.8 now loses to 4.0
    assert s.sample(row) == 2
    s.taken(2)  # 4.0 - 0.9 = 3.1, 3.8 for token 1, 3.5 for token 3
    assert s.sample(row) == 1
    assert row.tolist() == [0.0, 5.0, 4.0, 3.5]  # the caller's row is the model's
    negative = Sampler(0.0, 1.0, None, presence=-2.0)  # a negative penalty favours what was taken
    negative.taken(3)
    assert negative.sample(row) == 3
