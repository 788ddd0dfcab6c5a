"""The data-set path on a real two-node Ray cluster (tests/ray/conftest.py).

What is compared: each row's answer (``helpers.rows.ANSWER_KEYS``: id, error, best, choice_logp,
p_outside, abstained, scoring, best_by, n_tokens) bit for bit, and its set of keys, against one
session in this process answering the same rows one by one with ``Session.decide`` in input order.
Bit for bit holds because every decision is its prefix then its suffix, prefilled in those two
pieces on both sides, on the tiny qwen3moe in Q8_0 whose kernels round a row the same however many
rows share its ubatch (gate G19). How a row got its prefix (``n_reused``, ``reuse``, the batch keys)
and what it cost (the seconds) differ with the grouping and are not compared.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bmoe.config import SessionConfig
from bmoe.ray.batch import main as batch_main
from bmoe.ray.data import RayOptions, RayRun, in_order
from bmoe.ray.data.rows import answer_lines, as_command_line
from bmoe.session import Session
from bmoe.wire.protocol import Decide, ProtocolError, parse_line
from bmoe.wire.records import decide_fields
from helpers.rows import FLASH, answers, decide_rows, keys, with_bad_rows

pytestmark = pytest.mark.ray

N_PER_TASK = 50  # 6 prefixes: 300 decisions


@pytest.fixture(scope="module")
def cfg(tiny_models) -> SessionConfig:
    return SessionConfig(model=tiny_models("qwen3moe", "q8_0"), decide=True, decide_batch=4, n_ctx=512, n_threads=1)


@pytest.fixture(scope="module")
def rows() -> list[str]:
    return with_bad_rows(decide_rows(N_PER_TASK))


@pytest.fixture(scope="module")
def one_by_one(cfg: SessionConfig, rows: list[str]) -> list[dict]:
    """The single-process answers: one session, Session.decide per row, input order (a row that is
    no decision: that row alone through the same session)."""
    out = []
    with Session(cfg) as s:
        for line in rows:
            try:
                cmd = parse_line(as_command_line(line))
            except ProtocolError:
                cmd = None
            out += [decide_fields(s.decide(cmd.request))] if isinstance(cmd, Decide) else answer_lines(s, [line])
    return out


def _options(**kw: object) -> RayOptions:
    return RayOptions(address="unused: already connected", actors=2, batch_rows=16, flash_resource=FLASH, **kw)


def _actors(state: str = "ALIVE") -> list[dict]:
    """The pool's actors from the GCS actor table (ray.util.state would need the dashboard, which
    the test cluster does not run)."""
    from ray._private.state import actors

    return [a for a in actors(actor_state_name=state).values() if "SessionActor" in a["ActorClassName"]]


def test_two_actors_on_two_nodes_answer_what_one_session_answers(ray_cluster, cfg, rows, one_by_one) -> None:
    run = RayRun(rows, cfg, _options())
    got, nodes = [], set()
    for pair in run:
        got.append(pair)
        if len(nodes) < 2:
            nodes |= {a["Address"]["NodeID"] for a in _actors()}
    results = in_order(got, len(rows))
    assert answers(results) == answers(one_by_one)
    assert keys(results) == keys(one_by_one)
    assert sum("error" in r for r in results) == 5
    assert len(nodes) == 2, "each node holds one bmoe_flash, so the two actors run on different nodes"
    # rows sharing a prefix were sent together: most decisions restored or batched their prefix
    assert sum(1 for r in results if r.get("n_reused", 0) > 0) > len(rows) // 2
    assert any(r.get("batch_size", 1) > 1 for r in results)


def test_a_killed_actor_loses_and_duplicates_no_row(ray_cluster, cfg, rows, one_by_one) -> None:
    run = RayRun(rows, cfg, _options(max_restarts=2))
    got, killed = [], None
    for pair in run:
        got.append(pair)
        if killed is None:  # the first batch is back: others are in flight on both actors
            killed = _actors()[0]
            os.kill(killed["Pid"], signal.SIGKILL)
    results = in_order(got, len(rows))  # raises RowsLost on a missing or duplicated row
    assert answers(results) == answers(one_by_one)
    from ray._private.state import actors

    assert actors(actor_id=killed["ActorID"])["NumRestarts"] >= 1, "the killed actor was not restarted"


def test_bmoe_batch_on_the_cluster_writes_what_it_writes_without_ray(
    ray_cluster, cfg, rows, one_by_one, tmp_path: Path, capsys
) -> None:
    data = tmp_path / "data.jsonl"
    data.write_bytes(("\n".join(rows[:60]) + "\n\n").encode() + b'{"prefix":"\xff"}\n')
    flags = ["-m", str(cfg.model), "-c", "512", "-t", "1", "--decide-batch", "4"]
    assert batch_main([str(data), "--out", str(tmp_path / "here.jsonl"), *flags]) == 0
    # a process of its own, so that --ray ADDRESS connects to the cluster as a user's would
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("bmoe-batch")),
            str(data),
            "--out",
            str(tmp_path / "ray.jsonl"),
            "--ray",
            ray_cluster.address,
            "--actors",
            "2",
            "--batch-rows",
            "8",
            "--flash-resource",
            FLASH,
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    here = [json.loads(x) for x in (tmp_path / "here.jsonl").read_text().splitlines()]
    on_ray = [json.loads(x) for x in (tmp_path / "ray.jsonl").read_text().splitlines()]
    assert len(here) == len(on_ray) == 61  # one per non-blank line
    assert answers(here) == answers(on_ray) == answers(one_by_one[:60]) + [(None, on_ray[-1]["error"]) + (None,) * 7]
    assert on_ray[-1]["error"].startswith("request line is not valid UTF-8: byte 0xff")
    refused = sum("error" in r for r in one_by_one[:60]) + 1
    assert f"61 rows ({refused} refused or failed)" in capsys.readouterr().err
    summary = done.stderr.strip().splitlines()[-1]
    assert summary.startswith(f"bmoe-batch: 61 rows ({refused} refused or failed)")
    assert f"on Ray ({ray_cluster.address}, 2 actor(s))" in summary


def test_bmoe_eval_on_the_cluster_answers_what_it_answers_in_process(ray_cluster, cfg, tmp_path: Path, capsys) -> None:
    from bmoe.eval.dataset import shipped_set
    from bmoe.eval.main import main as eval_main

    data = tmp_path / "units.jsonl"
    data.write_text("".join(shipped_set("units").read_text().splitlines(keepends=True)[:40]))
    # contextual debiasing answers each row on its own (its content-free prompt once per session and
    # layout), so its debiased_p are compared too; pride is refused on Ray (tests/eval/test_eval_run.py)
    flags = ["-m", str(cfg.model), "-c", "512", "-t", "1", "--decide-batch", "4", "--debias", "contextual"]
    assert eval_main([str(data), "--out", str(tmp_path / "here"), *flags]) == 0
    assert (
        eval_main([str(data), "--out", str(tmp_path / "ray"), "--ray", ray_cluster.address, "--actors", "2", *flags])
        == 0
    )
    rows = {}
    for side in ("here", "ray"):
        rows[side] = [json.loads(x) for x in (tmp_path / side / "results.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rows["ray"]] == [r["line"] for r in rows["here"]] == list(range(1, 41))
    same = ("best", "choice_logp", "p_outside", "gold", "debiased_p", "prior")
    assert all(len(r["debiased_p"]) == 4 for r in rows["here"])
    assert [[r.get(k) for k in same] for r in rows["ray"]] == [[r.get(k) for k in same] for r in rows["here"]]
    doc = json.loads((tmp_path / "ray" / "metrics.json").read_text())
    assert doc["run"]["decided"] == 40 and doc["run"]["kept_state_hits"] > 20
    here = json.loads((tmp_path / "here" / "metrics.json").read_text())
    assert doc["metrics"] == here["metrics"] and doc["raw"] == here["raw"] and doc["raw"]["n_debiased"] == 40
