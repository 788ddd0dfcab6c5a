"""Order debiasing on SmolLM2-135M-Instruct: the model that answers A to almost everything.

On the first rows of the shipped `ordering` set (four options, structured form) the raw answer is
the first option on nearly every row (docs/eval.md); permuting the options, or dividing out a
PriDe prior estimated from a few of them, moves the picks off it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from bmoe.eval import dataset

N_ROWS = 8
K = 3  # pride: rows that estimate the prior


@pytest.fixture(scope="module")
def rows():
    return dataset.load(dataset.shipped_set("ordering")).rows[:N_ROWS]


def test_permute_and_pride_change_the_position_preference(open_smol, rows) -> None:
    s = open_smol(decide=True, decide_batch=4, decide_pride_sample=K)
    plain = s.decide_many([r.request for r in rows])
    permuted = s.decide_many([replace(r.request, debias="permute") for r in rows])
    pride = s.decide_many([replace(r.request, id=100 + i, debias="pride") for i, r in enumerate(rows)])
    for res in plain + permuted + pride:
        assert res.error is None, res.error
    raw_first = sum(r.scores.best == 0 for r in plain)
    assert raw_first >= N_ROWS - 1  # the bias this is about
    # the permuted answer's raw scores are the plain decision's: the given order is permutation 0
    for p, q in zip(plain, permuted):
        assert q.scores.choice_logp == pytest.approx(p.scores.choice_logp, abs=0.05)
        top, second = sorted(p.scores.choice_logp, reverse=True)[:2]
        if top - second > 0.1:  # batched in other company the scores move a little: a near tie may flip
            assert q.debias.best_raw == p.scores.best
        assert q.debias.decisions == 4
        assert sum(q.debias.debiased_p) == pytest.approx(1.0)
    assert sum(r.scores.best == 0 for r in permuted) <= raw_first - 3

    stages = [r.debias.stage for r in pride]
    assert stages == ["sample"] * K + ["prior"] * (N_ROWS - K)
    prior = pride[-1].debias.prior
    assert pride[-1].debias.prior_samples == K and sum(prior) == pytest.approx(1.0)
    assert max(range(4), key=prior.__getitem__) == 0  # the prior puts the most on A
    divided = pride[K:]
    assert all(r.debias.decisions == 1 for r in divided)
    assert sum(r.scores.best == 0 for r in divided) <= sum(r.debias.best_raw == 0 for r in divided) - 2
