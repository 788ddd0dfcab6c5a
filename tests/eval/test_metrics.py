"""bmoe.eval.metrics and the temperature fit against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bmoe.eval import metrics as m
from bmoe.eval.temperature import fit_temperature


def _row(probs: list[float], gold: int, p_out: float, abstained: bool = False) -> m.Scored:
    """A decision whose choices hold ``1 - p_out`` of the mass, split as ``probs`` (which sum to 1)."""
    return m.Scored(
        logp=tuple(math.log(p * (1 - p_out)) for p in probs), gold=gold, p_outside=p_out, abstained=abstained
    )


# renormalised top probability, right or wrong:
#   r1 0.62 right | r2 0.55 wrong (argmax 1, gold 0) | r3 0.85 wrong | r4 0.75 right
ROWS = [
    _row([0.62, 0.2, 0.18], 0, 0.1),
    _row([0.45, 0.55], 0, 0.2),
    _row([0.85, 0.15], 1, 0.3),
    _row([0.75, 0.05, 0.2], 0, 0.4),
]


def test_the_figures_of_four_rows() -> None:
    s = m.summary(ROWS)
    assert s["n"] == 4
    assert s["accuracy"] == 0.5
    assert s["nll"] == pytest.approx(-(math.log(0.62) + math.log(0.45) + math.log(0.15) + math.log(0.75)) / 4)
    brier = [0.38**2 + 0.2**2 + 0.18**2, 0.55**2 + 0.55**2, 0.85**2 + 0.85**2, 0.25**2 + 0.05**2 + 0.2**2]
    assert s["brier"] == pytest.approx(sum(brier) / 4)
    # one row per bin: ECE = mean |correct - confidence|
    assert s["ece"] == pytest.approx((0.38 + 0.55 + 0.85 + 0.25) / 4)
    # most confident first: r3 (wrong), r4, r1, r2 (wrong): error rates 1, 1/2, 1/3, 2/4
    assert s["aurc"] == pytest.approx((1 + 1 / 2 + 1 / 3 + 2 / 4) / 4)
    assert s["selective_accuracy_80"] == 0.5  # ceil(0.8 * 4) = 4 rows: all of them
    assert s["mean_confidence"] == pytest.approx((0.62 + 0.55 + 0.85 + 0.75) / 4)
    assert s["p_outside"] == pytest.approx(
        {"q0": 0.1, "q10": 0.13, "q25": 0.175, "q50": 0.25, "q75": 0.325, "q90": 0.37, "q100": 0.4, "mean": 0.25}
    )


def test_reliability_bins_are_right_closed_tenths() -> None:
    bins = m.reliability_bins(
        np.array([0.62, 0.55, 0.85, 0.75, 0.5, 0.05]), np.array([True, False, False, True, True, False])
    )
    assert [b["n"] for b in bins] == [1, 0, 0, 0, 1, 1, 1, 1, 1, 0]  # 0.5 falls in (0.4, 0.5]
    assert bins[6] == {
        "lo": pytest.approx(0.6),
        "hi": pytest.approx(0.7),
        "n": 1,
        "accuracy": 1.0,
        "confidence": pytest.approx(0.62),
    }
    assert bins[1]["accuracy"] is None and bins[1]["confidence"] is None
    # two rows in one bin: |mean accuracy - mean confidence|, weighted by the bin's share
    conf, correct = np.array([0.81, 0.89, 0.3]), np.array([True, False, False])
    assert m.expected_calibration_error(conf, correct) == pytest.approx(2 / 3 * abs(0.5 - 0.85) + 1 / 3 * 0.3)


def test_selective_accuracy_keeps_the_most_confident_share() -> None:
    conf = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    correct = np.array([True, False, True, True, False])
    assert m.selective_accuracy(conf, correct) == 0.75  # ceil(0.8 * 5) = 4 rows
    assert m.selective_accuracy(conf, correct, 0.4) == 0.5
    cov, acc = m.risk_coverage(conf, correct)
    assert cov.tolist() == [0.2, 0.4, 0.6, 0.8, 1.0]
    assert acc.tolist() == pytest.approx([1.0, 0.5, 2 / 3, 0.75, 0.6])
    # ties keep input order: a wrong row first among equals counts first
    assert m.aurc(np.array([0.5, 0.5]), np.array([False, True])) == pytest.approx((1 + 0.5) / 2)


def test_the_tradeoff_uses_decides_rule_and_abstention_reads_the_session() -> None:
    # best choice's probability over the vocabulary: 0.558, 0.44, 0.595, 0.45
    t = {r["threshold"]: r for r in m.tradeoff(ROWS, [0.0, 0.46, 0.58, 0.6])}
    assert (t[0.0]["coverage"], t[0.0]["accuracy"]) == (1.0, 0.5)
    assert (t[0.46]["coverage"], t[0.46]["accuracy"]) == (0.5, 0.5)
    assert (t[0.58]["coverage"], t[0.58]["accuracy"]) == (0.25, 0.0)
    assert (t[0.6]["coverage"], t[0.6]["accuracy"]) == (0.0, None)
    rows = [
        _row([0.62, 0.2, 0.18], 0, 0.1),
        _row([0.45, 0.55], 0, 0.2, abstained=True),
        _row([0.85, 0.15], 1, 0.3, abstained=True),
        _row([0.75, 0.05, 0.2], 0, 0.4),
    ]
    assert m.abstention(rows) == {"n_answered": 2, "n_abstained": 2, "coverage": 0.5, "accuracy_answered": 1.0}


def test_temperature_divides_the_scores_before_renormalising() -> None:
    lp = m.choice_logprobs([math.log(0.5), math.log(0.25)])
    assert np.exp(lp) == pytest.approx([2 / 3, 1 / 3])
    assert np.exp(m.choice_logprobs([math.log(0.5), math.log(0.25)], 2.0)) == pytest.approx(
        [math.sqrt(2) / (1 + math.sqrt(2)), 1 / (1 + math.sqrt(2))]
    )
    assert m.summary(ROWS, 3.0)["accuracy"] == m.summary(ROWS)["accuracy"]


def test_the_fitted_temperature_is_the_known_minimum() -> None:
    # Every row scores [2, 0]; gold is 0 in 3 of 4. The NLL is least where sigmoid(2 / T) = 3/4,
    # that is T = 2 / ln 3.
    rows = [m.Scored(logp=(2.0, 0.0), gold=g) for g in (0, 0, 0, 1) * 5]
    fit = fit_temperature(rows)
    assert fit.temperature == pytest.approx(2 / math.log(3), rel=1e-4)
    assert not fit.at_bound
    assert fit.nll_after < fit.nll_before
    assert fit.nll_after == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)), rel=1e-6)
    # all right with full confidence: no minimum inside the search, reported as such
    assert fit_temperature([m.Scored(logp=(2.0, 0.0), gold=0)] * 3).at_bound
