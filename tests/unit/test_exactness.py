"""tests/helpers/exactness.py: the check for computations run in different pieces can fail, and fails for
the right reasons (synthetic logit rows, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.exactness import assert_same_up_to_near_tie

V = 16


def row(top: int, margin: float = 3.0, second: int | None = None) -> np.ndarray:
    r = np.zeros(V, dtype=np.float32)
    r[top] = margin
    if second is not None:
        r[second] = margin - 0.01  # a near-tie
    return r


def test_identical_runs_compare_every_step() -> None:
    rows = [row(1), row(2), row(3)]
    assert assert_same_up_to_near_tie([1, 2, 3], rows, [1, 2, 3], rows, tol=0.1) == 3


def test_a_run_that_stopped_on_eog_keeps_one_row_more() -> None:
    a_rows = [row(1), row(0, second=5)]  # token 0 plays end-of-generation: chosen, not in the tokens
    assert assert_same_up_to_near_tie([1], a_rows, [1, 5], [row(1), row(5, second=0)], tol=0.1) == 2


def test_runs_may_part_at_a_near_tie() -> None:
    a = [row(1), row(2, second=3)]
    b = [row(1), row(3, second=2)]
    assert assert_same_up_to_near_tie([1, 2, 9], a + [row(9)], [1, 3, 4], b + [row(4)], tol=0.1) == 2


def test_runs_that_part_without_a_near_tie_fail() -> None:
    with pytest.raises(AssertionError, match=r"step 1: the choices differ \(2 vs 3\) without a near-tie"):
        assert_same_up_to_near_tie([1, 2], [row(1), row(2)], [1, 3], [row(1), row(3)], tol=0.1)


def test_log_probs_that_drift_beyond_the_tolerance_fail() -> None:
    with pytest.raises(AssertionError, match=r"step 1: log-prob of token 2 .*tolerance 0.1"):
        assert_same_up_to_near_tie([1, 2], [row(1), row(2, 3.0)], [1, 2], [row(1), row(2, 2.0)], tol=0.1)


def test_a_run_that_is_not_greedy_is_refused() -> None:
    with pytest.raises(AssertionError, match="not a greedy run"):
        assert_same_up_to_near_tie([2], [row(1)], [1], [row(1)], tol=0.1)
