"""bmoe.eval.report over result rows written by hand: which scores it ranks by, the split rule of
the temperature fit, the per-rule accuracies and the position counts."""

from __future__ import annotations

import math

import pytest

from bmoe.eval import dataset, report


def _result(logp: list[float], gold: int, split: str | None = None, **extra: object) -> dict:
    p = [math.exp(x) for x in logp]
    return {
        "choice_logp": logp,
        "p_outside": 1 - sum(p),
        "abstained": False,
        "gold": gold,
        "n_reused": 0,
        **({"split": split} if split else {}),
        **extra,
    }


def test_first_token_rows_are_ranked_by_choice_logp() -> None:
    rows = [_result([math.log(0.6), math.log(0.2)], 0), _result([math.log(0.1), math.log(0.3)], 0)]
    doc = report.compute(rows, fit=False, calib_split="calib", abstain_below=None)
    assert doc["metrics"]["accuracy"] == 0.5
    assert doc["metrics"]["nll"] == pytest.approx(-(math.log(0.75) + math.log(0.25)) / 2)
    assert doc["accuracy_by"] == {"sum": 0.5}
    assert doc["positions"] == {"picked": [1, 1], "gold": [2, 0]}
    assert doc["temperature"] is None and doc["abstention"] is None
    assert [r["threshold"] for r in doc["tradeoff"]][:3] == [0.0, 0.05, 0.1]


def test_a_row_with_best_by_is_ranked_by_the_score_it_names() -> None:
    # the sum prefers choice 0, the per-character score choice 1, which is gold
    row = _result([-1.0, -2.0], 1, best_by="norm", choice_logp_norm=[-0.5, -0.1], choice_logp_mean=[-1.0, -2.0])
    doc = report.compute([row], fit=False, calib_split="calib", abstain_below=None)
    assert doc["metrics"]["accuracy"] == 1.0
    assert doc["metrics"]["mean_confidence"] == pytest.approx(1 / (1 + math.exp(-0.4)))
    assert doc["accuracy_by"] == {"sum": 0.0, "mean": 0.0, "norm": 1.0}


def test_the_temperature_is_fitted_on_one_split_and_reported_on_the_other() -> None:
    calib = [_result([0.0, -2.0], g, "calib") for g in (0, 0, 0, 1)]
    test = [_result([0.0, -1.0], g, "test") for g in (0, 1, 0)]
    doc = report.compute(calib + test, fit=True, calib_split="calib", abstain_below=0.3)
    t = doc["temperature"]
    assert t["calib_n"] == 4 and t["temperature"] == pytest.approx(2 / math.log(3), rel=1e-4)
    assert doc["metrics"]["n"] == t["after"]["n"] == 3
    assert doc["evaluated"] == 'answered rows whose split is not "calib"'
    assert doc["abstention"]["n_answered"] == 3 and 0.3 in [r["threshold"] for r in doc["tradeoff"]]
    # one side empty: no fit, every row evaluated, and the report says why
    doc = report.compute(test, fit=True, calib_split="calib", abstain_below=None)
    assert doc["temperature"] == {
        "error": 'no temperature fitted: 0 answered rows in split "calib" and 3 outside it (both must be > 0)'
    }
    assert doc["metrics"]["n"] == 3
    md = report.markdown(
        {
            **doc,
            "data": "x.jsonl",
            "data_sha256": "ab" * 32,
            "model": "m.gguf",
            "answered": 3,
            "refused": [],
            "skipped_lines": [],
            "run": {
                "decided": 3,
                "seconds": 1.0,
                "decisions_per_s": 3.0,
                "resumed": 0,
                "kept_state_hits": 0,
                "batches": 0,
            },
        }
    )
    assert "Temperature: no temperature fitted: 0 answered rows" in md and "| T = 1 | 3 |" in md


def test_a_field_the_protocol_gains_reaches_the_request_unchanged() -> None:
    line = '{"suffix":"Q?","choices":["yes","no"],"gold":0,"scoring":"full","best_by":"norm"}'
    r = dataset.parse_row(line, 1).request
    assert (r.scoring, r.best_by) == ("full", "norm")
    # bmoe-eval --scoring fills it in where a line has none
    r = dataset.parse_row('{"suffix":"Q?","choices":["yes","no"],"gold":0}', 1, {"scoring": "full"}).request
    assert r.scoring == "full"


def test_debiased_rows_are_scored_by_debiased_p_and_raw_keeps_choice_logp() -> None:
    # raw prefers the first option on both rows; debiased picks the gold one on both
    rows = [
        _result([math.log(0.6), math.log(0.2)], 1, debiased_p=[0.4, 0.6]),
        _result([math.log(0.5), math.log(0.1)], 0, debiased_p=[0.7, 0.3]),
    ]
    doc = report.compute(rows, fit=False, calib_split="calib", abstain_below=None)
    assert doc["metrics"]["accuracy"] == 1.0
    assert doc["metrics"]["nll"] == pytest.approx(-(math.log(0.6) + math.log(0.7)) / 2)
    assert doc["positions"]["picked"] == [1, 1]
    raw = doc["raw"]
    assert raw["n_debiased"] == 2 and raw["metrics"]["accuracy"] == 0.5 and raw["positions"]["picked"] == [2, 0]
    assert raw["metrics"]["nll"] == pytest.approx(-(math.log(0.25) + math.log(5 / 6)) / 2)
    assert "Before debiasing (choice_logp, T = 1): accuracy 0.5000" in report.markdown(
        {
            **doc,
            "data": "x.jsonl",
            "model": "m.gguf",
            "data_sha256": "0" * 64,
            "answered": 2,
            "refused": [],
            "skipped_lines": [],
            "run": {
                "decided": 2,
                "seconds": 1.0,
                "decisions_per_s": 2.0,
                "resumed": 0,
                "kept_state_hits": 0,
                "batches": 0,
            },
        }
    )
    assert report.compute([_result([0.0, -1.0], 0)], fit=False, calib_split="calib", abstain_below=None)["raw"] is None


def test_the_tradeoff_of_a_best_by_row_compares_what_decide_compares() -> None:
    # ranked by norm, choice 0 is best; decide abstains on exp(choice_logp[0]) = exp(-3) < 0.1,
    # though exp(max choice_logp_norm) = exp(-0.5) is above it
    row = _result([-3.0, -2.5], 0, best_by="norm", choice_logp_norm=[-0.5, -1.0], abstained=True)
    doc = report.compute([row], fit=False, calib_split="calib", abstain_below=0.1)
    t = {r["threshold"]: r for r in doc["tradeoff"]}
    assert t[0.1] == {"threshold": 0.1, "coverage": 0.0, "accuracy": None}
    assert t[0.0] == {"threshold": 0.0, "coverage": 1.0, "accuracy": 1.0}
    assert doc["abstention"]["coverage"] == t[0.1]["coverage"]
    assert [s.p_best for s in report.scored([row])] == [math.exp(-3.0)]
    from bmoe.eval.metrics import curves

    # p_best exp(-3) ranks the best_by row after the wrong row's exp(-0.6); exp(-0.5) would rank it first
    ranked = curves(report.scored([row, _result([-0.6, -4.0], 1)]))
    assert list(ranked["raw_accuracy"]) == [0.0, 0.5]


def test_a_debiased_row_abstains_on_its_debiased_best() -> None:
    row = _result([-0.2, -3.0], 1, debiased_p=[0.45, 0.55])
    t = {
        r["threshold"]: r for r in report.compute([row], fit=False, calib_split="calib", abstain_below=0.5)["tradeoff"]
    }
    assert t[0.5]["coverage"] == 1.0 and t[0.6]["coverage"] == 0.0
    assert [s.p_best for s in report.scored([row])] == [0.55]
    assert [s.p_best for s in report.scored([row], raw=True)] == [math.exp(-0.2)]
