"""Temperature scaling: one T for the choices' renormalised probabilities, fitted by minimising
the mean NLL of the gold choice over a calibration split (docs/eval.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.optimize import minimize_scalar

from bmoe.eval.metrics import Scored, gold_logprobs

# T is searched over [1/100, 100]. The NLL is convex in 1/T, so it has one minimum along log T too,
# which a bounded scalar search finds; a minimum at an end of the range is reported as such.
LOG_T_BOUND = math.log(100.0)


@dataclass(frozen=True, slots=True)
class TemperatureFit:
    temperature: float
    nll_before: float  # on the calibration rows, T = 1
    nll_after: float  # on the calibration rows, the fitted T
    n: int
    at_bound: bool  # the minimum sits on a bound of the search: T is only a limit

    def as_dict(self) -> dict:
        return {
            "temperature": self.temperature,
            "calib_n": self.n,
            "calib_nll_before": self.nll_before,
            "calib_nll_after": self.nll_after,
            "at_bound": self.at_bound,
        }


def mean_nll(rows: Sequence[Scored], temperature: float) -> float:
    return float(-gold_logprobs(rows, temperature).mean())


def fit_temperature(rows: Sequence[Scored]) -> TemperatureFit:
    """The T in [0.01, 100] that minimises the mean gold NLL over ``rows`` (at least one)."""
    if not rows:
        raise ValueError("no calibration rows to fit a temperature on")
    res = minimize_scalar(
        lambda log_t: mean_nll(rows, math.exp(log_t)),
        bounds=(-LOG_T_BOUND, LOG_T_BOUND),
        method="bounded",
        options={"xatol": 1e-6},
    )
    t = math.exp(float(res.x))
    after = mean_nll(rows, t)
    # No minimum inside the range when an end of it does as well (the NLL keeps falling towards
    # T -> 0 when every row is right, and flattens out at 0 in floating point on the way).
    ends = min(mean_nll(rows, math.exp(-LOG_T_BOUND)), mean_nll(rows, math.exp(LOG_T_BOUND)))
    return TemperatureFit(
        temperature=t, nll_before=mean_nll(rows, 1.0), nll_after=after, n=len(rows), at_bound=ends <= after + 1e-9
    )
