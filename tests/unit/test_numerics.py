"""The shared numeric helpers: one log-softmax, one token-prefix comparison."""

from __future__ import annotations

import numpy as np
import pytest

from bmoe.numerics import common_prefix_len, log_softmax


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([], [], 0),
        ([], [1, 2], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2], 2),
        ([1, 2], (1, 2, 3), 2),
        ([5, 2, 3], [1, 2, 3], 0),
        ([1, 2, 3, 4], [1, 2, 9, 4], 2),
        (list(range(5000)), list(range(4999)) + [-1], 4999),
    ],
)
def test_common_prefix_len(a: list[int], b: list[int], expected: int) -> None:
    assert common_prefix_len(a, b) == expected
    assert common_prefix_len(b, a) == expected


def test_log_softmax_normalises_in_float64() -> None:
    logits = np.array([[1000.0, 1000.0, -1000.0]], dtype=np.float32)
    out = log_softmax(logits)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out[0, :2], np.log(0.5), rtol=0, atol=1e-12)
    assert np.isclose(np.logaddexp.reduce(out[0]), 0.0, atol=1e-12)
