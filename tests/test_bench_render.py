"""docs/benchmarks.md is bench/render.py's output from the committed records in bench/results/: a
figure typed by hand, or a record committed without the page rendered again, fails here."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import record  # noqa: E402
import render  # noqa: E402

PAGE = ROOT / "docs" / "benchmarks.md"


def test_the_page_is_the_committed_records_rendered() -> None:
    text = render.render(record.load())
    assert PAGE.read_text() == text, "docs/benchmarks.md differs from its records: run bench/render.py"


def test_every_plot_the_page_shows_is_committed() -> None:
    shown = re.findall(r"!\[[^\]]*\]\((img/bench/[^)]+\.png)\)", PAGE.read_text())
    assert len(shown) >= 5
    assert [p for p in shown if not (PAGE.parent / p).is_file()] == []


def test_a_changed_figure_changes_the_page() -> None:
    recs = record.load()
    before = render.render(recs)
    changed = copy.deepcopy(recs)
    stream = render.pick([r for r in changed if r["bench"] == "stream"])[0]  # the run the page shows
    row = next(r for r in stream["tables"][0]["rows"] if r["name"] == "bmoe cache off")
    row["decode_tok_s"] = 99.0
    after = render.render(changed)
    assert before != after
    assert "| bmoe cache off | 99.00 |" in after


def test_every_record_has_its_machine_and_verdicts() -> None:
    recs = record.load()
    assert {r["bench"] for r in recs} >= {b.key for b in render.BENCHES}
    for r in recs:
        assert r["schema"] == record.SCHEMA
        for key in ("cpu", "cpu_flags", "cores", "mem_gib", "mem_limit_mib", "disk_read_mib_s"):
            assert key in r["machine"], (r["path"], key)
        assert r["commit"] and r["date"] and r["command"]
        assert all(t["verdict"] in ("PASS", "FAIL", "n/a") for t in r["targets"])
        unknown = [k for k, v in r["machine"].items() if v == record.UNKNOWN]
        for k in unknown:  # a fact not recovered says why
            assert any(n.startswith(k) or k in n for n in r["machine"]["notes"]), (r["path"], k)


def test_the_ratio_column_divides_by_the_runs_own_baseline() -> None:
    t = record.table(
        "t",
        [("name", "run", ""), ("tok_s", "tok/s", ".1f")],
        [{"name": "base", "tok_s": 2.0}, {"name": "fast", "tok_s": 5.0}, {"name": "broken", "tok_s": None}],
        {"row": "base", "key": "tok_s", "label": "x base"},
    )
    lines = render.table_lines(t)
    assert "| fast | 5.0 | 2.50x |" in lines and "| broken | - | - |" in lines


def test_a_run_writes_one_record_that_loads_back(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("BMOE_BENCH_SHORT", "2 rounds, not 5")
    rec = record.record(
        "smoke",
        command="bench/x.py",
        config={"work": tmp_path},
        tables=[record.table("t", [("name", "run", "")], [{"name": "a"}])],
        targets=[record.target("a fast", 1.0, ">= 1", True)],
        machine_facts={"cpu": "x", "notes": []},
    )
    path = record.write(rec, tmp_path)
    again = record.write(rec, tmp_path)  # the same minute: a second file, not an overwrite
    assert path != again and json.loads(path.read_text())["targets"][0]["verdict"] == "PASS"
    load = json.loads(path.read_text())["machine"]["load_avg"]  # how busy the shared machine was
    assert load["start"] == record.START_LOAD and len(load["end"]) == 3
    assert json.loads(path.read_text())["config"]["short_run"] == "2 rounds, not 5"
    assert "; load " in render.machine_line(rec["machine"])  # type: ignore[arg-type]
    assert [r["bench"] for r in record.load(tmp_path)] == ["smoke", "smoke"]


def test_the_machine_facts_are_read_here() -> None:
    m = record.machine(disk=ROOT)
    assert isinstance(m["cores"], int) and m["cores"] >= 1
    assert m["cpu"] and isinstance(m["cpu_flags"], list)
    assert m["disk_read_mib_s"] == record.UNKNOWN or float(m["disk_read_mib_s"]) > 0  # type: ignore[arg-type]


def test_a_stream_run_becomes_its_two_tables() -> None:
    import bench_records as br

    derived = {
        "oom": {"name": "llama.cpp default load (extra bufts)", "status": "OOM-killed", "wall_s": 12.0},
        "llama": {"name": "llama.cpp mmap", "decode_tok_s": 0.4, "round_tok_s": [0.4, 0.5]},
        "off": {"name": "bmoe cache off", "decode_tok_s": 4.0, "bound_ratio": 1.2},
        "paired": {"status": "ok", "plain_median": 10.0, "bmoe_median": 9.8, "plain_prefill_median": 50.0}
        | {"bmoe_prefill_median": 52.0},
    }
    limited, warm = br.stream_tables(derived)
    lines = render.table_lines(limited)
    assert any(ln.startswith("| llama.cpp default load (extra bufts) | OOM-killed after 12 s |") for ln in lines)
    assert any(ln.startswith("| bmoe cache off | 4.00 |") and ln.endswith("| 10.00x |") for ln in lines)
    assert [r["name"] for r in warm["rows"]] == ["plain llama.cpp (mmap)", "bmoe resident"]
    assert render.table_lines(warm)[-2].endswith("| 0.98x |")


def test_a_plan_run_holds_what_its_plots_read(tmp_path: Path) -> None:
    import bench_records as br
    import plots

    limits = [
        {
            "limit_gib": 2.0,
            "plan_mode": "streamed",
            "plan_settings": {"cache_mb": 1196, "prefetch": True, "n_ubatch": 1024},
            "planned_latency_s": 1.6,
            "planned_decode_tok_s": 5.5,
            "best_latency": ("cache30+ra", 1.45),
            "best_decode": ("cache30", 5.7),
            "latency_ratio": 1.1,
            "decode_ratio": 1.04,
            "long": {
                "planned": {"latency_s": 27.0, "n_ubatch": 2048, "read_mib": 4508.0},
                "cache30+ra": {"status": "OOM-killed"},
            },
            "verdicts": {"decisions": "PASS", "decode": "PASS", "never OOM-killed": "PASS"},
        },
        {
            "limit_gib": None,
            "plan_mode": "resident",
            "plan_settings": {},
            "planned_latency_s": 0.9,
            "planned_decode_tok_s": 11.0,
            "best_latency": ("cache30+ra", 1.45),
            "best_decode": ("cache30+ra", 6.1),
            "verdicts": {"resident with no limit": "PASS"},
        },
    ]
    presets = {"uniform": {"limits": limits}}
    (t,) = br.plan_tables(presets)
    assert [r["name"] for r in t["rows"]] == ["2 GiB", "none"]
    assert t["rows"][0]["long_grid"] == "cache30+ra: OOM-killed" and t["rows"][1]["cache_mib"] is None
    assert "| 2 GiB | cache 1196 MiB, read-ahead, ubatch 1024 | 1.60 | 1.45 |" in "\n".join(render.table_lines(t))
    rec = {"bench": "plan", "date": "d", "partial": False, "tables": [t], "machine": {"cpu": "x"}, "config": {}}
    targets = br.plan_targets(presets)
    assert [x["verdict"] for x in targets] == ["PASS"] * 4 and targets[0]["value"] == 1.1
    by = {"plan": [rec]}
    for p in plots.PLOTS:
        if p.bench == "plan":
            assert p.has_data(by)
            p.draw(by, tmp_path / p.name)
            assert (tmp_path / p.name).stat().st_size > 1000


def test_a_batch_size_sweep_becomes_its_table_and_curve(tmp_path: Path) -> None:
    import bench_records as br
    import plots

    gib = 2**20
    report = {
        "streamed": {
            str(k): {"wall_s": w, "read_bytes": b * gib}
            for k, w, b in ((1, 32.0, 3200), (4, 16.0, 800), (16, 12.0, 320))
        },
        "resident": {"1": [3.2, 3.6, 3.4], "4": [3.2, 3.2, 3.2], "16": [3.0, 3.1, 3.2]},
    }
    t = br.decide_sizes_table(report, 16)
    assert [r["batch"] for r in t["rows"]] == [1, 4, 16]
    lines = render.table_lines(t)
    # per decision: 32 s / 16 = 2.00; 3200 MiB / 16 = 200; SmolLM2 3.4 / 16; spread (3.6 - 3.2) / 3.4
    assert "| 1 | 2.00 | 200 | 0.212 | 12% | 1.00x |" in lines
    assert "| 16 | 0.75 | 20 | 0.194 | 6% | 0.38x |" in lines
    rec = {"bench": "decide_batch", "date": "d", "partial": True, "tables": [t], "machine": {"cpu": "x"}}
    (p,) = [p for p in plots.PLOTS if p.bench == "decide_batch"]
    assert not p.has_data({"decide_batch": [rec | {"tables": []}]})  # two sizes make no curve
    assert p.has_data({"decide_batch": [rec]})
    p.draw({"decide_batch": [rec]}, tmp_path / p.name)
    assert (tmp_path / p.name).stat().st_size > 1000


def test_a_batch_size_answers_in_slices_of_that_size() -> None:
    import decide_batch

    class Fake:
        def __init__(self) -> None:
            self.calls: list[tuple[str, int]] = []

        def decide(self, r: int) -> int:
            self.calls.append(("decide", 1))
            return r

        def decide_many(self, rs: list[int]) -> list[int]:
            self.calls.append(("many", len(rs)))
            return rs

    for size, calls in (
        (1, [("decide", 1)] * 16),
        (4, [("many", 4)] * 4),
        (16, [("many", 16)]),
        (5, [("many", 5)] * 3 + [("many", 1)]),
    ):
        s = Fake()
        assert decide_batch.answer(s, list(range(16)), size) == list(range(16))
        assert s.calls == calls, size


def test_llama_mmap_is_the_plans_baseline_not_a_grid_choice(tmp_path: Path) -> None:
    import bench_records as br
    import plan
    import plots

    def cfg(lat: float, tok: float) -> dict:
        return {"summary": {"latency_s": lat, "decode_tok_s": tok}}

    run = {"configs": {"planned": cfg(1.6, 5.5), "llama": cfg(0.5, 9.0), "off+ra": cfg(2.0, 4.0)}}
    row = plan.compare(run, 2.0)
    assert row["best_latency"] == ("off+ra", 2.0) and row["best_decode"] == ("off+ra", 4.0)
    assert (row["llama_latency_s"], row["llama_decode_tok_s"]) == (0.5, 9.0)
    row |= {"plan_mode": "streamed", "plan_settings": {"cache_mb": 0, "n_ubatch": 2048}}
    (t,) = br.plan_tables({"uniform": {"limits": [row, row | {"limit_gib": None}]}})
    assert t["rows"][0]["llama_s"] == 0.5 and t["rows"][0]["llama_tok_s"] == 9.0
    full = {"bench": "plan", "date": "a", "partial": False, "machine": {"cpu": "x"}, "config": {}}
    old = full | {"tables": [copy.deepcopy(t)]}
    for r in old["tables"][0]["rows"]:
        r["llama_s"] = r["llama_tok_s"] = None
    short = full | {"date": "b", "partial": True, "tables": [t]}
    by = {"plan": [short, old | {"date": "c"}]}
    assert plots._plan_with_llama(by) is short  # the run that measured the baseline, though partial
    assert plots._plan_with_llama({"plan": [old]}) is old
    (p,) = [p for p in plots.PLOTS if p.name == "plan-speed.png"]
    p.draw(by, tmp_path / p.name)
    assert (tmp_path / p.name).stat().st_size > 1000


def test_a_handful_of_figures_is_one_row_and_an_unregistered_bench_still_shows() -> None:
    t = record.figures("f", {"token_ms": 12.5, "share": 0.25, "trace": [1, 2], "recall": {"8": 0.5}})
    assert render.table_lines(t) == [
        "**f**",
        "",
        "| token_ms | share | recall.8 |",
        "|---|---|---|",
        "| 12.5 | 0.25 | 0.5 |",
        "",
    ]
    rec = record.record("nobench", command="bench/nobench.py", config={}, tables=[t], machine_facts={"cpu": "x"})
    rec["path"] = "bench/results/nobench/x.json"
    page = render.render([*record.load(), rec])
    assert "## bench/nobench.py" in page and "add `Bench('nobench', ...)` to bench/bench_text.py" in page
    assert "| token_ms | share | recall.8 |" in page


def test_the_latest_full_run_is_shown_and_the_others_are_one_line() -> None:
    base = {"schema": record.SCHEMA, "bench": "x", "command": "c", "commit": "k", "notes": [], "targets": []}
    t = record.table("t", [("name", "run", "")], [{"name": "row-of-%s"}])

    def rec(date: str, partial: bool, short: str = "") -> dict:
        rows = [{"name": f"row-of-{date}"}]
        cfg = {"short_run": short} if short else {}
        return base | {"date": date, "partial": partial, "config": cfg, "machine": {}, "tables": [t | {"rows": rows}]}

    recs = [rec("a", False) | {"path": "bench/results/x/a.json"}, rec("b", True, "2 rounds") | {"path": "p/b.json"}]
    shown, others = render.pick(recs)
    assert shown is recs[0] and others == [recs[1]]  # a later partial run does not hide the full one
    assert render.earlier_line(others).startswith("Other runs") and "(partial; no targets)" in render.earlier_line(
        others
    )
    shown, others = render.pick(recs[1:])  # with no full run, the latest partial one is shown
    assert shown is recs[1] and others == []
    lines = render.run_lines(shown, "Latest run")
    assert "cut short on purpose (2 rounds)" in lines[0] and "| row-of-b |" in lines


def test_a_table_the_plot_draws_whole_is_left_to_the_plot() -> None:
    page = PAGE.read_text()
    section = page.split("## The cache policy on recorded routing")[1].split("\n## ")[0]
    assert "img/bench/cache-replay.png" in section and "| budget MiB |" not in section
    assert "The plot draws" in section and "| held out | chosen on |" in section  # the knobs table stays
