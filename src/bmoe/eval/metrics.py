"""Calibration metrics over answered decisions (pure numpy; docs/eval.md defines each one).

A row is what a decision returned (``logp``: each choice's log-probability over the whole
vocabulary, BMOE_DECIDE's ``choice_logp`` or the score its ``best_by`` names; ``p_best``, the
probability decide's ``abstain_below`` compares; ``p_outside``; ``abstained``) plus the index of
the right choice. Every metric but the p_outside figures works on
the choices' probabilities *renormalised to sum 1*: ``softmax(logp / T)`` (T = 1 unless a
temperature was fitted). The mass outside the choices is reported on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bmoe.numerics import log_softmax

ECE_BINS = 10  # equal-width bins over the top renormalised probability
SELECTIVE_COVERAGE = 0.8
P_OUTSIDE_QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
TRADEOFF_THRESHOLDS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass(frozen=True, slots=True)
class Scored:
    """One answered decision and its gold index."""

    logp: tuple[float, ...]
    gold: int
    p_outside: float = 0.0
    abstained: bool = False
    # what decide's abstain_below compares: exp(choice_logp[best]) (a debiased row: its debiased_p
    # of the best option); None: exp(max logp), the same when logp is choice_logp
    p_best: float | None = None


def best_probability(r: Scored) -> float:
    return r.p_best if r.p_best is not None else math.exp(max(r.logp))


def choice_logprobs(logp: Sequence[float], temperature: float = 1.0) -> np.ndarray:
    """log of the choices' probabilities renormalised over the choices, after dividing by T."""
    return log_softmax(np.asarray(logp, dtype=np.float64) / temperature)


def gold_logprobs(rows: Sequence[Scored], temperature: float = 1.0) -> np.ndarray:
    """Each row's renormalised log-probability of its gold choice."""
    return np.array([choice_logprobs(r.logp, temperature)[r.gold] for r in rows], dtype=np.float64)


def _predictions(rows: Sequence[Scored], temperature: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: top renormalised probability, correctness of the argmax (ties: the first), Brier."""
    conf = np.empty(len(rows))
    correct = np.empty(len(rows), dtype=bool)
    brier = np.empty(len(rows))
    for i, r in enumerate(rows):
        p = np.exp(choice_logprobs(r.logp, temperature))
        best = int(np.argmax(p))
        conf[i], correct[i] = p[best], best == r.gold
        onehot = np.zeros_like(p)
        onehot[r.gold] = 1.0
        brier[i] = float(np.sum((p - onehot) ** 2))
    return conf, correct, brier


def reliability_bins(conf: np.ndarray, correct: np.ndarray, n_bins: int = ECE_BINS) -> list[dict]:
    """Equal-width bins over [0, 1]: bin b holds confidences in (b/n, (b+1)/n] (the first also 0)."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    which = np.clip(np.digitize(conf, edges[1:-1], right=True), 0, n_bins - 1)
    bins = []
    for b in range(n_bins):
        mask = which == b
        n = int(mask.sum())
        bins.append(
            {
                "lo": float(edges[b]),
                "hi": float(edges[b + 1]),
                "n": n,
                "accuracy": float(correct[mask].mean()) if n else None,
                "confidence": float(conf[mask].mean()) if n else None,
            }
        )
    return bins


def expected_calibration_error(conf: np.ndarray, correct: np.ndarray, n_bins: int = ECE_BINS) -> float:
    """sum over bins of (rows in bin / rows) * |accuracy in bin - mean confidence in bin|."""
    total = len(conf)
    return float(
        sum(
            b["n"] / total * abs(b["accuracy"] - b["confidence"])
            for b in reliability_bins(conf, correct, n_bins)
            if b["n"]
        )
    )


def risk_coverage(conf: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Answering only the k most confident rows (stable order: ties in input order), for k = 1..n:
    coverage k/n and the accuracy over those k rows."""
    order = np.argsort(-conf, kind="stable")
    k = np.arange(1, len(conf) + 1)
    return k / len(conf), np.cumsum(correct[order]) / k


def aurc(conf: np.ndarray, correct: np.ndarray) -> float:
    """Area under the risk-coverage curve: the mean over k = 1..n of the error rate of the k most
    confident rows."""
    _, acc = risk_coverage(conf, correct)
    return float(np.mean(1.0 - acc))


def selective_accuracy(conf: np.ndarray, correct: np.ndarray, coverage: float = SELECTIVE_COVERAGE) -> float:
    """Accuracy over the ceil(coverage * n) most confident rows."""
    k = max(1, math.ceil(round(coverage * len(conf), 9)))
    _, acc = risk_coverage(conf, correct)
    return float(acc[k - 1])


def quantiles(values: Sequence[float]) -> dict[str, float]:
    """``q0`` (min) .. ``q100`` (max) by numpy's linear interpolation, and the mean."""
    v = np.asarray(values, dtype=np.float64)
    out = {f"q{round(q * 100)}": float(np.quantile(v, q)) for q in P_OUTSIDE_QUANTILES}
    out["mean"] = float(v.mean())
    return out


def summary(rows: Sequence[Scored], temperature: float = 1.0) -> dict:
    """Every metric of docs/eval.md over ``rows`` (at least one)."""
    if not rows:
        raise ValueError("no rows to compute metrics over")
    conf, correct, brier = _predictions(rows, temperature)
    return {
        "n": len(rows),
        "temperature": temperature,
        "accuracy": float(correct.mean()),
        "nll": float(-gold_logprobs(rows, temperature).mean()),
        "brier": float(brier.mean()),
        "ece": expected_calibration_error(conf, correct),
        "ece_bins": reliability_bins(conf, correct),
        "aurc": aurc(conf, correct),
        "selective_accuracy_80": selective_accuracy(conf, correct),
        "mean_confidence": float(conf.mean()),
        "p_outside": quantiles([r.p_outside for r in rows]),
    }


def curves(rows: Sequence[Scored], temperature: float = 1.0) -> dict[str, np.ndarray]:
    """What the pictures draw: the confidences and correctness, the risk-coverage curve ranked by the
    renormalised top probability, and ranked by the best choice's probability that abstain_below
    compares (``p_best``)."""
    conf, correct, _ = _predictions(rows, temperature)
    raw = np.array([best_probability(r) for r in rows])
    cov, acc = risk_coverage(conf, correct)
    raw_cov, raw_acc = risk_coverage(raw, correct)
    return {
        "conf": conf,
        "correct": correct,
        "coverage": cov,
        "accuracy": acc,
        "raw_coverage": raw_cov,
        "raw_accuracy": raw_acc,
    }


def tradeoff(rows: Sequence[Scored], thresholds: Sequence[float] = TRADEOFF_THRESHOLDS) -> list[dict]:
    """The abstention trade-off by decide's own rule: a row abstains when its best choice's
    probability, ``p_best``, is under the threshold."""
    raw = np.array([best_probability(r) for r in rows])
    correct = np.array([int(np.argmax(r.logp)) == r.gold for r in rows])
    out = []
    for t in thresholds:
        answered = raw >= t
        n = int(answered.sum())
        out.append(
            {
                "threshold": float(t),
                "coverage": n / len(rows),
                "accuracy": float(correct[answered].mean()) if n else None,
            }
        )
    return out


def abstention(rows: Sequence[Scored]) -> dict:
    """What the session did with ``abstain_below``: the rows it answered and their accuracy."""
    answered = [r for r in rows if not r.abstained]
    n = len(answered)
    hits = sum(int(np.argmax(r.logp)) == r.gold for r in answered)
    return {
        "n_answered": n,
        "n_abstained": len(rows) - n,
        "coverage": n / len(rows),
        "accuracy_answered": hits / n if n else None,
    }
