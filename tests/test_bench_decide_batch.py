"""bench/decide_batch.py's targets as #29 restated them: the batch against its compute floor, and
resident batching against one by one within the rounds' own noise band."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import decide_batch as db  # noqa: E402

MIB = 2**20


def _verdicts(report: dict) -> dict[str, bool | None]:
    return {name: ok for name, _, _, ok in db.targets(report)}


def test_the_streamed_batch_is_judged_against_its_compute_floor_not_one_by_one() -> None:
    off = {
        "cache_mb": 0,
        "batched": {"wall_s": 10.0, "read_bytes": 100 * MIB},
        "one_by_one": {"wall_s": 24.0, "read_bytes": 1300 * MIB},
    }
    got = _verdicts({"streamed": [off, {"compute_floor_s": 8.0}]})
    # 10 / 8 = 1.25x its floor: PASS, though one by one is only 2.4x slower
    assert got == {
        "streamed cache off: bytes one by one / batched": True,
        "streamed cache off: batch / its compute floor (the batch resident)": True,
    }
    got = _verdicts({"streamed": [off, {"compute_floor_s": 7.0}]})  # 1.43x
    assert got["streamed cache off: batch / its compute floor (the batch resident)"] is False
    got = _verdicts({"streamed": [off]})  # no floor measured: no verdict
    assert got["streamed cache off: batch / its compute floor (the batch resident)"] is None


def test_resident_batching_may_lose_only_within_the_noise_band_of_its_rounds() -> None:
    def res(batched: list[float], one: list[float]) -> dict:
        return {
            "batched_s": batched,
            "one_by_one_s": one,
            "median_ratio": db.statistics.median(one) / db.statistics.median(batched),
            "noise_band": max((max(t) - min(t)) / db.statistics.median(t) for t in (batched, one)),
        }

    name = "resident SmolLM2: one by one / batched (medians)"
    # batched 1% slower, rounds spread 4%: within the band
    assert _verdicts({"resident": res([1.01, 1.03, 0.99], [1.00, 1.02, 0.98])})[name] is True
    # batched 10% slower, rounds spread 2%: beyond it
    assert _verdicts({"resident": res([1.10, 1.11, 1.09], [1.00, 1.01, 0.99])})[name] is False
    assert res([1.0, 1.1, 0.9], [1.0, 1.0, 1.0])["noise_band"] == pytest.approx(0.2)
