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


WORK_REFUSAL = "decide: this request may take {n} prefills (each debias permutation, pride sample and choice scored"


def test_bmoe_batch_refuses_a_row_over_the_work_limit_alone(tiny_models, tmp_path) -> None:
    from bmoe.ray.batch import main as batch_main

    data = tmp_path / "rows.jsonl"
    rows = [
        {"id": 1, "prefix": "Pick one. ", "suffix": "Which?", "choices": list(CHOICES[:10]), "scoring": "full"},
        {"id": 2, "prefix": "Pick one. ", "suffix": "Which?", "choices": ["A", "B"]},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    model = str(tiny_models("qwen3moe", "q8_0"))
    argv = [str(data), "--out", str(out), "-m", model, "-c", "512", "-t", "1", "--decide-max-work", "10"]
    assert batch_main(argv) == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["id"] for g in got] == [1, 2]
    assert got[0]["error"].startswith(WORK_REFUSAL.format(n=11)) and "error" not in got[1]


def test_bmoe_eval_refuses_a_row_over_the_work_limit_alone(tiny_models, tmp_path, capsys) -> None:
    from bmoe.eval.main import main as eval_main

    data = tmp_path / "rows.jsonl"
    rows = [
        {"prefix": "Pick one. ", "suffix": " Which?", "choices": ["yes", "no", "maybe"], "gold": 0},
        {"prefix": "Pick one. ", "suffix": " Which?", "choices": ["yes", "no"], "gold": 0},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = str(tiny_models("qwen3moe", "q8_0"))
    argv = [str(data), "--out", str(tmp_path / "out"), "-m", model, "-c", "512", "-t", "1"]
    assert eval_main([*argv, "--scoring", "full", "--decide-max-work", "3"]) == 0
    err = capsys.readouterr().err
    assert f"bmoe-eval: line 1 refused: {WORK_REFUSAL.format(n=4)}" in err, err
    assert "line 2 refused" not in err and "Traceback" not in err
