"""bmoe-eval end to end on SmolLM2-135M-Instruct (the default model) over a few rows: the output
files, batches through Session.decide_many, resuming after an interruption without recomputing a
row, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bmoe.eval import dataset
from bmoe.eval.main import EXIT_INTERRUPTED, main
from bmoe.session import Session

FAST = ["-t", "1", "-c", "512"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight rows with two prefixes, interleaved (4 units, 4 arithmetic), four of them "calib"."""
    sets = dataset.shipped_sets()
    units = sets["units"].read_text().splitlines()[:4]
    arith = sets["arithmetic"].read_text().splitlines()[:4]
    path = tmp_path_factory.mktemp("data") / "mixed.jsonl"
    path.write_text("\n".join(x for pair in zip(units, arith) for x in pair) + "\n")
    return path


@pytest.fixture()
def calls(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The request ids of every Session.decide_many call, in order."""
    seen: list[list[int]] = []
    real = Session.decide_many

    def spy(self: Session, requests):  # type: ignore[no-untyped-def]
        seen.append([r.id for r in requests])
        return real(self, requests)

    monkeypatch.setattr(Session, "decide_many", spy)
    return seen


def _results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_a_run_writes_every_output_from_batches(data: Path, tmp_path: Path, calls, capsys) -> None:
    out = tmp_path / "out"
    assert main([str(data), "--out", str(out), "--decide-batch", "4", "--fit-temperature", *FAST]) == 0
    # grouped by prefix, 4 per call: the units rows (odd lines), then the arithmetic ones
    assert calls == [[1, 3, 5, 7], [2, 4, 6, 8]]
    rows = _results(out)
    assert [r["line"] for r in rows] == list(range(1, 9)) == [r["id"] for r in rows]  # input order
    golds = [json.loads(x)["gold"] for x in data.read_text().splitlines()]
    assert [r["gold"] for r in rows] == golds
    assert all(r["batch_size"] == 4 for r in rows) and len({r["batch_id"] for r in rows}) == 2
    assert {"choice_logp", "p_outside", "n_reused", "reuse", "data_id", "split"} <= set(rows[0])
    doc = json.loads((out / "metrics.json").read_text())
    # the metrics agree with the rows they came from: T = 1 figures over the rows outside "calib"
    test_rows = [r for r in rows if r["split"] != "calib"]
    assert doc["metrics"]["n"] == len(test_rows) == 4
    assert doc["metrics"]["accuracy"] == np.mean([np.argmax(r["choice_logp"]) == r["gold"] for r in test_rows])
    assert doc["temperature"]["calib_n"] == 4 and doc["temperature"]["after"]["n"] == 4
    assert doc["run"] == {**doc["run"], "decided": 8, "resumed": 0, "batches": 2}
    assert doc["run"]["kept_state_hits"] == sum(r["n_reused"] > 0 for r in rows) >= 6
    for name in ("reliability.png", "coverage.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr()
    assert printed.out == (out / "report.md").read_text()
    assert "| T = 1 | 4 |" in printed.out and "dec/s" in printed.err and "kept_hits" in printed.err


def test_an_interrupted_run_resumes_without_recomputing_a_row(
    data: Path, tmp_path: Path, monkeypatch, calls, capsys
) -> None:
    out = tmp_path / "out"
    real = Session.decide_many  # the spy of `calls`

    def interrupted(self: Session, requests):  # type: ignore[no-untyped-def]
        if len(calls) == 2:  # Ctrl-C during the third call, before it answered anything
            raise KeyboardInterrupt
        return real(self, requests)

    monkeypatch.setattr(Session, "decide_many", interrupted)
    assert main([str(data), "--out", str(out), "--batch", "3", *FAST]) == EXIT_INTERRUPTED
    assert calls == [[1, 3, 5], [7]]
    assert [r["line"] for r in _results(out)] == [1, 3, 5, 7]
    assert "interrupted after 4 decisions this run; rerun the same command to resume" in capsys.readouterr().err
    # a write cut short by the interruption: the partial last line is dropped, not an error
    with (out / "results.jsonl").open("a") as fh:
        fh.write('{"id":2,"best"')
    monkeypatch.setattr(Session, "decide_many", real)
    calls.clear()
    assert main([str(data), "--out", str(out), "--batch", "3", *FAST]) == 0
    assert calls == [[2, 4, 6], [8]]  # only what was missing
    rows = _results(out)
    assert [r["line"] for r in rows] == list(range(1, 9))
    assert "resuming: 4 of 8 rows are already in" in capsys.readouterr().err
    doc = json.loads((out / "metrics.json").read_text())
    assert (doc["run"]["decided"], doc["run"]["resumed"], doc["metrics"]["n"]) == (4, 4, 8)
    # and once more: nothing left to answer, the model is not even opened
    calls.clear()
    assert main([str(data), "--out", str(out), *FAST]) == 0
    assert calls == [] and _results(out) == rows


def test_another_data_set_or_setting_is_refused_before_the_model_opens(
    data: Path, tmp_path: Path, calls, capsys
) -> None:
    out = tmp_path / "out"
    two = tmp_path / "two.jsonl"
    two.write_text("\n".join(data.read_text().splitlines()[:2]) + "\n")
    assert main([str(two), "--out", str(out), *FAST]) == 0
    before = (out / "results.jsonl").read_bytes()
    capsys.readouterr()
    assert main([str(data), "--out", str(out), *FAST]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        f"bmoe-eval: --out: {out / 'results.jsonl'} holds the results of another run: "
        "the data (sha256 of the file) differs (data_sha256 was "
    )
    assert err[-1].endswith(f"give another --out, or delete {out / 'results.jsonl'} to start over")
    assert main([str(two), "--out", str(out), "--abstain-below", "0.5", *FAST]) == 1
    assert "--abstain-below differs (abstain_below was null, now 0.5)" in capsys.readouterr().err
    assert main([str(two), "--out", str(out), "--chatml", *FAST]) == 1
    assert "the chat template setting (--chatml / --no-chat) differs" in capsys.readouterr().err
    assert (out / "results.jsonl").read_bytes() == before and len(calls) == 2  # the first run's two prefixes


def test_bad_lines_and_refused_rows_are_reported_not_fatal(tmp_path: Path, calls, capsys) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"prefix": "Say yes.", "suffix": " Answer:", "choices": ["yes", "no"], "gold": 0}),
                json.dumps({"prefix": "Say yes.", "suffix": " Answer:", "choices": ["yes", "no"], "gold": 2}),
                "not json",
                json.dumps({"suffix": "Is the sky green? " * 200, "choices": ["yes", "no"], "gold": 0}),
                '{"prefix": "Say yes.", "choices": ["yes", "no"], "gold": '
                + "1" * 5000
                + "}",  # over Python's digit limit
            ]
        )
        + "\n"
    )
    out = tmp_path / "out"
    assert main([str(path), "--out", str(out), *FAST]) == 0
    err = capsys.readouterr().err
    assert f'{path} line 2 skipped: "gold" is 2 but there are 2 choices (0..1)' in err
    assert f"{path} line 3 skipped: not valid JSON: " in err
    assert "bmoe-eval: line 4 refused: decide: the prompt is " in err
    assert " tokens but the context holds 512; shorten the prefix or suffix" in err
    assert f"{path} line 5 skipped: not valid JSON: an integer of more than 4300 digits, more than Python reads" in err
    assert "Traceback" not in err and "internal error" not in err
    rows = _results(out)
    assert [r["line"] for r in rows] == [1, 4] and "error" in rows[1]
    doc = json.loads((out / "metrics.json").read_text())
    assert [s["line"] for s in doc["skipped_lines"]] == [2, 3, 5] and [r["line"] for r in doc["refused"]] == [4]
    assert doc["answered"] == doc["metrics"]["n"] == 1
    # a rerun asks the refused row again (it may have been the session's settings), and only it
    calls.clear()
    assert main([str(path), "--out", str(out), *FAST]) == 0
    assert calls == [[4]] and [r["line"] for r in _results(out)] == [1, 4]
    assert "resuming: 1 of 2 rows are already in" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--fit-temperature"], '--fit-temperature: 0 of the 8 rows have "split":"train"'),
        (["-c", "8"], "--ctx-size (n_ctx): must be an integer >= 16, got 8"),
        (["--set", "nope"], None),
        (["-m", "BAD"], "model: cannot read GGUF "),  # refused from its header, before llama.cpp (#38.8)
    ],
)
def test_refusals_before_any_work_are_one_line(data: Path, tmp_path: Path, args, msg, capsys) -> None:
    argv = [str(data), "--out", str(tmp_path / "out"), *FAST, *args]
    if args[0] == "--fit-temperature":
        argv += ["--calib-split", "train"]
    if args[0] == "-m":
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(b"GGUF\0\0\0\0")
        argv[-1] = str(bad)
    if args[0] == "--set":
        with pytest.raises(SystemExit) as e:  # DATA and --set together: a usage error
            main(argv)
        assert e.value.code == 2
        assert main(["--set", "nope", "--out", str(tmp_path / "out")]) == 1
        msg = "--set: no shipped set named 'nope'; the sets are arithmetic, ordering, phone_agent, units"
    else:
        assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"bmoe-eval: {msg}") and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_an_out_that_cannot_be_written_is_refused_before_any_work(
    data: Path, tmp_path: Path, unwritable_dir: Path, calls, capsys
) -> None:
    blocked = tmp_path / "blocked"
    (blocked / "metrics.json").mkdir(parents=True)
    for out, msg in [
        (unwritable_dir / "out", f"--out: cannot make the folder {unwritable_dir / 'out'}: "),
        (unwritable_dir, f"--out: cannot write in the folder {unwritable_dir}: Permission denied"),
        (data / "out", f"--out: cannot make the folder {data / 'out'}: Not a directory"),
        (
            blocked,
            f"--out: {blocked / 'metrics.json'} is a folder; the run writes a regular file of that name "
            "(remove it, or give another --out)",
        ),
    ]:
        assert main([str(data), "--out", str(out), *FAST]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"bmoe-eval: {msg}") and "internal error" not in err[-1], err
    assert calls == [] and sorted(p.name for p in blocked.iterdir()) == ["metrics.json"]


@pytest.fixture(scope="module")
def units5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five structured rows of the units set: one prefix, one label list (A-D)."""
    path = tmp_path_factory.mktemp("data") / "units5.jsonl"
    path.write_text("\n".join(dataset.shipped_sets()["units"].read_text().splitlines()[:5]) + "\n")
    return path


def test_a_resumed_pride_run_gives_the_figures_of_a_fresh_one(
    units5: Path, tmp_path: Path, monkeypatch, calls, capsys
) -> None:
    pride = ["--debias", "pride", "--decide-pride-sample", "2", "--batch", "1", *FAST]  # a call a row
    assert main([str(units5), "--out", str(tmp_path / "fresh"), *pride]) == 0
    fresh = _results(tmp_path / "fresh")
    assert [r["pride_stage"] for r in fresh] == ["sample"] * 2 + ["prior"] * 3
    real = Session.decide_many  # the spy of `calls`

    def interrupted(self: Session, requests):  # type: ignore[no-untyped-def]
        if len(calls) == 3:  # rows 1-3 answered (both samples and one divided row), then Ctrl-C
            raise KeyboardInterrupt
        return real(self, requests)

    monkeypatch.setattr(Session, "decide_many", interrupted)
    calls.clear()
    assert main([str(units5), "--out", str(tmp_path / "resumed"), *pride]) == EXIT_INTERRUPTED
    monkeypatch.setattr(Session, "decide_many", real)
    calls.clear()
    assert main([str(units5), "--out", str(tmp_path / "resumed"), *pride]) == 0
    assert calls == [[1], [2], [3], [4], [5]]  # the new session estimates the prior from the same rows
    assert "resuming: 0 of 5 rows are already in" in capsys.readouterr().err
    resumed = _results(tmp_path / "resumed")
    keys = ("pride_stage", "prior", "debiased_p", "best")
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in fresh]
    # another K would answer the pride rows otherwise: refused, as another --debias is
    assert (
        main(
            [str(units5), "--out", str(tmp_path / "resumed"), "--debias", "pride", "--decide-pride-sample", "3", *FAST]
        )
        == 1
    )
    assert "--decide-pride-sample differs (decide_pride_sample was 2, now 3)" in capsys.readouterr().err


def test_pride_rows_are_refused_on_ray_before_anything_starts(units5: Path, tmp_path: Path, capsys) -> None:
    assert main([str(units5), "--out", str(tmp_path / "out"), "--ray", "local", "--debias", "pride", *FAST]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        'bmoe-eval: --ray: 5 rows use "debias": "pride", whose prior a session estimates from the first '
        'rows it answers; each Ray actor has its own session and gets the rows in another order, so the '
        'figures would not be those of one process; run them without --ray'
    ]
    assert not (tmp_path / "out").exists()


def test_the_actor_flags_reach_ray_and_get_around_cache_mb_auto(
    data: Path, tmp_path: Path, tiny_models, monkeypatch, capsys
) -> None:
    import bmoe.ray.data
    from bmoe.errors import ConfigError

    streamed = ["-m", str(tiny_models("qwen3moe", "q8_0")), "--moe-stream", "--cache-mb", "auto", *FAST]
    argv = [str(data), "--out", str(tmp_path / "out"), "--ray", "local", *streamed]
    real = bmoe.ray.data.RayRun
    seen = []

    def sized(lines, config, options):  # type: ignore[no-untyped-def]
        seen.append(options)
        real.__init__.__globals__["sizing"](config, options)  # what RayRun does before Ray starts
        raise ConfigError("stop here")

    monkeypatch.setattr(bmoe.ray.data, "RayRun", sized)
    assert main(argv) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "bmoe-eval: cache_mb: auto sizes the cache from the RAM of whichever node the actor lands on; for Ray give "
        "--cache-mb N, or a ceiling with --cache-ceil-mb, or --actor-memory-mb"
    )
    assert main([*argv, "--actor-memory-mb", "8000", "--actor-cpus", "2"]) == 1
    assert "bmoe-eval: stop here" in capsys.readouterr().err
    assert (seen[-1].memory_mb, seen[-1].num_cpus) == (8000, 2.0)
    with pytest.raises(SystemExit) as e:
        main([str(data), "--out", str(tmp_path / "out"), "--actor-memory-mb", "8000"])
    assert e.value.code == 2 and "--actor-memory-mb needs --ray ADDRESS|local" in capsys.readouterr().err


def test_on_ray_a_failed_row_is_retried_not_counted_as_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    import bmoe.ray.data

    path = tmp_path / "three.jsonl"
    path.write_text(
        "".join(
            json.dumps({"prefix": "p", "suffix": f" {i}?", "choices": ["A", "B"], "gold": 0}) + "\n" for i in range(3)
        )
    )
    answered = {"best": 0, "choice_logp": [-0.5, -2.0], "p_outside": 0.2, "abstained": False, "n_reused": 0}
    back = [
        {"id": 1, "error": "internal error: RuntimeError: bug", "failed": True},
        {"id": 2, "error": "decide: refused"},
        {"id": 3, **answered},
    ]
    monkeypatch.setattr(bmoe.ray.data, "RayRun", lambda lines, config, options: enumerate(back))
    out = tmp_path / "out"
    assert main([str(path), "--out", str(out), "--ray", "local", *FAST]) == 0
    err = capsys.readouterr().err
    assert "bmoe-eval: line 1 failed: internal error: RuntimeError: bug" in err
    assert "bmoe-eval: line 2 refused: decide: refused" in err
    assert "1 rows failed and are not in the metrics; rerun the same command to retry them" in err
    assert [r["line"] for r in _results(out)] == [2, 3]
    doc = json.loads((out / "metrics.json").read_text())
    assert (doc["answered"], doc["unanswered"], doc["refused"]) == (1, 1, [{"line": 2, "error": "decide: refused"}])


@pytest.mark.parametrize(
    "failure, line",
    [
        (
            ModuleNotFoundError("No module named 'ray'", name="ray"),
            "bmoe-eval: --ray needs the ray extra (ray is missing): pip install 'bmoe[ray]'",
        ),
        (
            RuntimeError("Failed to run map_batches: 3 retries spent\n  Traceback (most recent call last):\n    ..."),
            "bmoe-eval: the run failed: RuntimeError: Failed to run map_batches: 3 retries spent; rerun the same command "
            "to resume (answered rows are in {results})",
        ),
    ],
)
def test_ray_failures_are_one_line(tmp_path: Path, monkeypatch, capsys, failure, line) -> None:
    import bmoe.ray.data

    path = tmp_path / "two.jsonl"
    path.write_text(
        "".join(
            json.dumps({"prefix": "p", "suffix": f" {i}?", "choices": ["A", "B"], "gold": 0}) + "\n" for i in range(2)
        )
    )
    answered = {"id": 1, "best": 0, "choice_logp": [-0.5, -2.0], "p_outside": 0.2, "abstained": False, "n_reused": 0}

    def run(lines, config, options):  # type: ignore[no-untyped-def]
        if isinstance(failure, ImportError):
            raise failure
        yield 0, answered
        raise failure

    monkeypatch.setattr(bmoe.ray.data, "RayRun", run)
    out = tmp_path / "out"
    assert main([str(path), "--out", str(out), "--ray", "local", *FAST]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == line.format(results=out / "results.jsonl") and "Traceback" not in "\n".join(err)
    if not isinstance(failure, ImportError):
        assert [r["line"] for r in _results(out)] == [1]  # what came back is kept for the rerun


def test_a_special_file_in_out_is_refused_before_any_work(data: Path, tmp_path: Path, calls, capsys) -> None:
    """A FIFO where results.jsonl goes, or a link to a device where run.json goes, is refused
    before any work and left as it was (appending to a FIFO would block; a rename would replace it)."""
    import os
    import stat

    for name, make, what in [
        ("results.jsonl", os.mkfifo, "a FIFO (named pipe)"),
        ("run.json", lambda p: p.symlink_to("/dev/null"), "a character device"),
    ]:
        out = tmp_path / name.split(".")[0]
        out.mkdir()
        make(out / name)
        assert main([str(data), "--out", str(out), *FAST]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == (
            f"bmoe-eval: --out: {out / name} is {what}; the run writes a regular file of that "
            "name (remove it, or give another --out)"
        ), err
        assert sorted(p.name for p in out.iterdir()) == [name]
    assert stat.S_ISFIFO(os.lstat(tmp_path / "results" / "results.jsonl").st_mode)
    assert calls == [] and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_full_disk_is_one_line_naming_the_file_and_the_run_resumes(
    data: Path, tmp_path: Path, monkeypatch, calls, capsys
) -> None:
    """ENOSPC while results are appended is one refusal line naming the file (it was "internal error:
    OSError" inside the progress bar's line), exit 1; the rows written before it are kept and a
    rerun answers only the rest."""
    import errno

    from bmoe.eval.store import ResultStore

    out = tmp_path / "out"
    real = ResultStore.append
    written: list[int] = []

    class FullDisk:
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self) -> None:
            pass

    def full_after_three(self: ResultStore, row: dict) -> None:  # type: ignore[no-untyped-def]
        if len(written) == 3:
            self._fh = FullDisk()
        else:
            written.append(row["line"])
        real(self, row)

    monkeypatch.setattr(ResultStore, "append", full_after_three)
    assert main([str(data), "--out", str(out), "--batch", "4", *FAST]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        f"bmoe-eval: cannot write {out / 'results.jsonl'}: No space left on device; the rows "
        f"answered so far are kept in {out / 'results.jsonl'}: make room and rerun the same command "
        "to resume"
    )
    assert "internal error" not in "\n".join(err) and not (out / "metrics.json").exists()
    assert not err[-2].endswith("bmoe-eval: cannot write")  # not on the progress bar's line
    assert [r["line"] for r in _results(out)] == written == [1, 3, 5]
    monkeypatch.setattr(ResultStore, "append", real)
    calls.clear()
    assert main([str(data), "--out", str(out), "--batch", "4", *FAST]) == 0
    assert sorted(i for c in calls for i in c) == [2, 4, 6, 7, 8]  # only what was not written
    assert [r["line"] for r in _results(out)] == list(range(1, 9))


def test_a_second_run_on_the_same_out_is_refused_while_the_first_runs(
    data: Path, tmp_path: Path, calls, capsys
) -> None:
    """Two runs answering into one folder would both answer the same rows: the folder's lock file is
    held for a run, and a second run is refused before any work; once the first ends, it runs."""
    import fcntl
    import os

    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / ".bmoe-eval.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a first run, in another process as far as flock goes
        assert main([str(data), "--out", str(out), *FAST]) == 1
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"bmoe-eval: --out: {out} is in use by another bmoe-eval run (it holds {out / '.bmoe-eval.lock'}); "
            "wait for it to end, or give another --out"
        )
        assert calls == [] and not (out / "results.jsonl").exists()
    finally:
        os.close(fd)
    assert main([str(data), "--out", str(out), *FAST]) == 0
    assert main([str(data), "--out", str(out), *FAST]) == 0  # the lock went with the run that held it


@pytest.mark.parametrize("name", ["run.json", "metrics.json", "report.md", "reliability.png", "coverage.png"])
def test_a_full_disk_names_the_output_file_that_failed(
    data: Path, tmp_path: Path, monkeypatch, calls, capsys, name: str
) -> None:
    """A write that fails once the file is open (a full disk) carries no file name in its OSError:
    the refusal still names the file that failed, not the folder (it said "cannot write runs/x"
    for metrics.json, and "internal error: OSError" for run.json); a rerun then completes."""
    import errno

    from bmoe.eval import plots

    out = tmp_path / "out"
    full = OSError(errno.ENOSPC, "No space left on device")  # as write() raises it: no filename
    disk_full = [True]  # the first run only
    if name.endswith(".png"):
        func = name.split(".")[0]
        real = getattr(plots, func)

        def fail_picture(path: Path, *a, **k) -> None:  # type: ignore[no-untyped-def]
            path.write_bytes(b"\x89PNG")  # the picture cut short
            if disk_full[0]:
                raise full
            real(path, *a, **k)

        monkeypatch.setattr(plots, func, fail_picture)
    else:
        real_write = Path.write_text

        def fail_text(self: Path, *a, **k):  # type: ignore[no-untyped-def]
            if self.name == name and disk_full[0]:
                raise full
            return real_write(self, *a, **k)

        monkeypatch.setattr(Path, "write_text", fail_text)
    assert main([str(data), "--out", str(out), *FAST]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        f"bmoe-eval: cannot write {out / name}: No space left on device; the rows answered so far are "
        f"kept in {out / 'results.jsonl'}: make room and rerun the same command to resume"
    )
    disk_full[0] = False
    calls.clear()
    assert main([str(data), "--out", str(out), *FAST]) == 0
    answered = 0 if name == "run.json" else 8  # run.json is written before any row is answered
    assert sorted(i for c in calls for i in c) == list(range(1, 9))[answered:]
    assert [r["line"] for r in _results(out)] == list(range(1, 9))
    assert all((out / n).stat().st_size > 100 for n in ("metrics.json", "report.md", "reliability.png", "coverage.png"))
