"""bench/stream_report.py's decode targets as #29 restated them: cache off against the slower of its
I/O bound and the resident compute floor."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import stream_report as sr  # noqa: E402

BOUND = "bmoe cache off vs its bound (the slower of its I/O bound and the resident compute floor)"


def _targets(off: dict, floor_tok_s: float | None) -> dict[str, dict]:
    d = {"off": off, "paired": {"bmoe_median": floor_tok_s} if floor_tok_s else {}}
    return {t["target"]: t for t in sr.targets(d)}


def test_a_compute_bound_machine_is_judged_against_its_resident_floor() -> None:
    # reads alone would allow 10 tok/s, but resident decode runs at 5: the floor is the bound
    t = _targets({"decode_tok_s": 4.5, "bound_tok_s": 10.0}, 5.0)
    assert t[BOUND]["value"] == pytest.approx(5.0 / 4.5) and t[BOUND]["verdict"] == "PASS"
    assert t["bmoe cache off: decode time / the resident compute floor's"]["value"] == pytest.approx(5.0 / 4.5)
    t = _targets({"decode_tok_s": 4.0, "bound_tok_s": 10.0}, 5.0)  # 1.25x
    assert t[BOUND]["verdict"] == "FAIL"


def test_an_io_bound_machine_is_judged_against_its_reads() -> None:
    t = _targets({"decode_tok_s": 3.6, "bound_tok_s": 4.0}, 10.0)
    assert t[BOUND]["value"] == pytest.approx(4.0 / 3.6) and t[BOUND]["verdict"] == "PASS"
    t = _targets({"decode_tok_s": 3.0, "bound_tok_s": 4.0}, None)  # no floor measured: the I/O bound alone
    assert t[BOUND]["value"] == pytest.approx(4.0 / 3.0) and t[BOUND]["verdict"] == "FAIL"
