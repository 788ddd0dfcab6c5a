"""Full scoring's memory and a request's work are bounded (issue #38): the rows of the choices'
tokens are reduced to their target log-probs as each call returns (it held ~1.5 MB a choice, so
10,000 choices took 16 GB), and a request that may take more prefills than the session's
``decide_max_work`` is refused alone, on every surface (Python, the line protocol; bmoe-eval and
bmoe-batch answer through the same Session)."""

from __future__ import annotations

import io
import json
import tracemalloc

from bmoe.cli.loop import run_session
from bmoe.decide.types import DecideRequest

CHOICES = tuple(f"option number {i} of many" for i in range(120))  # each several tokens


def test_memory_for_full_scoring_does_not_grow_with_the_choices(open_tiny) -> None:
    """120 choices of ~5 tokens on a 49152-word vocabulary: the old code kept a float64 row per token
    of every choice (~190 KB each, about 100 MB here) until all were scored; now one call's rows."""
    s = open_tiny(decide=True, decide_batch=4)
    req = DecideRequest(id=1, prefix="Pick one. ", suffix="Which?", choices=CHOICES, scoring="full")
    s.decide(DecideRequest(id=0, prefix="Pick one. ", suffix="Which?", choices=CHOICES[:2], scoring="full"))
    tracemalloc.start()
    try:
        r = s.decide(req)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.error is None and len(r.scores.choice_logp) == len(CHOICES)
    assert peak < 24 << 20, peak  # 4 side sequences' rows at a time, not 120 choices'


def test_a_request_over_the_work_limit_is_refused_alone(open_tiny) -> None:
    s = open_tiny(decide=True, decide_batch=4, decide_max_work=10)
    big = DecideRequest(id=1, prefix="Pick one. ", suffix="Which?", choices=CHOICES[:10], scoring="full")
    ok = DecideRequest(id=2, prefix="Pick one. ", suffix="Which?", choices=("A", "B"))
    refused, answered = s.decide_many([big, ok])
    assert refused.refused and refused.error == (
        "decide: this request may take 11 prefills (each debias permutation, pride sample and choice scored in "
        "full counts one), over this session's limit of 10 a request (--decide-max-work); give fewer choices, or "
        "raise the limit"
    )
    assert answered.error is None
    assert (
        s.decide(DecideRequest(id=3, prefix="Pick one. ", suffix="Which?", choices=CHOICES[:9], scoring="full")).error
        is None
    )  # 10 prefills: at the limit
    # the line protocol says the same, and the session goes on
    lines = (
        json.dumps(
            {
                "cmd": "decide",
                "id": 7,
                "prefix": "Pick one. ",
                "suffix": "Which?",
                "choices": list(CHOICES[:10]),
                "scoring": "full",
            }
        )
        + "\n"
        + json.dumps({"cmd": "decide", "id": 8, "prefix": "Pick one. ", "suffix": "Which?", "choices": ["A", "B"]})
        + "\n"
    )
    out = io.StringIO()
    run_session(s, io.StringIO(lines), out)
    decided = [json.loads(ln.split(" ", 1)[1]) for ln in out.getvalue().splitlines() if ln.startswith("BMOE_DECIDE")]
    assert [d["id"] for d in decided] == [7, 8]
    assert decided[0]["error"].startswith("decide: this request may take 11 prefills") and "error" not in decided[1]
