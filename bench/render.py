"""Render docs/benchmarks.md (and its plots under docs/img/bench/) from the records in bench/results/.

    .venv/bin/python bench/render.py            # write the page and the plots
    .venv/bin/python bench/render.py --check    # exit 1 if the page differs from the records

The page is this script's output, never edited by hand: a bench run writes its record
(bench/record.py), this script turns the latest record of each bench into its section, and
tests/test_bench_render.py fails when the committed page differs from what the committed
records give. The text that explains each bench lives in ``BENCHES`` below.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PAGE = ROOT / "docs" / "benchmarks.md"
sys.path.insert(0, str(HERE))

from bench_text import BENCHES, FOOTER, HEADER, Bench  # noqa: E402
from plots import PLOTS  # noqa: E402
from record import RESULTS, UNKNOWN, load  # noqa: E402


def fmt(v: object, spec: str = "") -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)) and spec:
        return format(v, spec)
    if isinstance(v, float):
        return format(v, ".0f") if abs(v) >= 1000 else format(v, ".3g")
    if isinstance(v, list):
        return " / ".join(fmt(x, spec) for x in v)
    return str(v).replace("|", "/")


def ratio_cell(row: dict, base_row: dict | None, baseline: dict) -> str:
    key = baseline["key"]
    num = row.get(key)
    den = row.get(baseline["over"]) if "over" in baseline else (base_row or {}).get(key)
    if not isinstance(num, (int, float)) or not isinstance(den, (int, float)) or den == 0:
        return "-"
    return f"{num / den:.2f}x"


def figures_lines(t: dict) -> list[str]:
    """A table of named scalar figures (record.figures) laid on its side: one header, one row."""
    rows = t["rows"]
    return [
        f"**{t['title']}**",
        "",
        "| " + " | ".join(fmt(r["name"]) for r in rows) + " |",
        "|" + "---|" * len(rows),
        "| " + " | ".join(fmt(r["value"]) for r in rows) + " |",
        "",
    ]


def table_lines(t: dict) -> list[str]:
    cols = t["columns"]
    if [c[0] for c in cols] == ["name", "value"] and not t.get("baseline") and 0 < len(t["rows"]) <= 12:
        return figures_lines(t)
    base = t.get("baseline")
    labels = [c[1] for c in cols] + ([base["label"]] if base else [])
    out = [f"**{t['title']}**", "", "| " + " | ".join(labels) + " |", "|" + "---|" * len(labels)]
    base_row = None
    if base and base.get("row"):
        base_row = next((r for r in t["rows"] if r.get("name") == base["row"]), None)
    for r in t["rows"]:
        if "status" in r and len(r) == 2:  # a run that produced no figures
            cells = [fmt(r["name"]), r["status"]] + [""] * (len(labels) - 2)
        else:
            cells = [fmt(r.get(c[0]), c[2]) for c in cols] + ([ratio_cell(r, base_row, base)] if base else [])
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def target_lines(targets: list[dict]) -> list[str]:
    if not targets:
        return []
    out = ["| target | measured | goal | verdict |", "|---|---|---|---|"]
    for t in targets:
        v = t.get("value")
        measured = fmt(v) if not isinstance(v, float) else f"{v:.3g}"
        if t.get("note"):
            measured += f" ({t['note']})"
        verdict = t["verdict"] if t["verdict"] != "FAIL" else "**FAIL**"
        out.append(f"| {fmt(t['target'])} | {measured} | {fmt(t['goal'])} | {verdict} |")
    return out + [""]


def machine_line(m: dict) -> str:
    def known(v: object, unit: str = "") -> str:
        return "unknown" if v in (UNKNOWN, None) else f"{fmt(v)}{unit}"

    flags = m.get("cpu_flags")
    flags_s = "unknown" if flags in (UNKNOWN, None) else (", ".join(flags) or "none of note")
    limit = m.get("mem_limit_mib")
    limit_s = "none" if limit is None else known(limit, " MiB")
    load = m.get("load_avg")
    load_s = (
        f"; load {load['start'][0]:g} at the start, {load['end'][0]:g} at the end" if isinstance(load, dict) else ""
    )
    return (
        f"{known(m.get('cpu'))}; flags {flags_s}; {known(m.get('cores'))} cores; RAM {known(m.get('mem_gib'), ' GiB')}; "
        f"memory limit {limit_s}; disk read {known(m.get('disk_read_mib_s'), ' MiB/s')}; "
        f"kernel {known(m.get('kernel'))}; llama-cpp-python {known(m.get('llama_cpp_python'))}{load_s}"
    )


def run_lines(rec: dict, heading: str, covered: Callable[[dict], bool] | None = None) -> list[str]:
    """A run's section body; the tables ``covered`` accepts are left to the plot above them, which
    draws every figure they hold (the figures stay in the record)."""
    link = Path("..", rec["path"]).as_posix()
    short = rec["config"].get("short_run")
    out = [
        f"{heading}: {rec['date']}, commit {rec['commit']}, `{rec['command']}` "
        f"([record]({link})){f', cut short on purpose ({short})' if short else ''}. "
        f"Machine: {machine_line(rec['machine'])}.",
        "",
    ]
    left = [t for t in rec["tables"] if covered(t)] if covered else []
    for t in rec["tables"]:
        if t not in left:
            out += table_lines(t)
    if left:
        names = "; ".join(str(t["title"]).split(" (")[0] for t in left)
        out += [f"The plot draws {names}; each point's figures are in the [record]({link}).", ""]
    out += target_lines(rec["targets"])
    out += [f"- {n}" for n in rec["notes"]]
    if rec["notes"]:
        out.append("")
    return out


def pick(recs: list[dict]) -> tuple[dict | None, list[dict]]:
    """(the run shown: the latest full run, else the latest partial one; the others, newest
    first) of one bench's records, oldest first. A partial run (a subset of the configurations,
    often a quick check on a busy machine) does not hide the full run that answers the question."""
    if not recs:
        return None, []
    shown = next((r for r in reversed(recs) if not r.get("partial")), recs[-1])
    return shown, [r for r in reversed(recs) if r is not shown]


def earlier_line(recs: list[dict]) -> str:
    def one(r: dict) -> str:
        kind = "partial" if r.get("partial") else "full"
        return f"[{r['date']}]({Path('..', r['path']).as_posix()}) ({kind}; {verdicts([r])})"

    return (
        "Other runs (kept as records, newest first; plots name the run they draw): " + ", ".join(map(one, recs)) + "."
    )


def verdicts(recs: list[dict]) -> str:
    v = [t["verdict"] for r in recs for t in r["targets"]]
    if not v:
        return "no targets"
    return f"{v.count('PASS')} PASS, {v.count('FAIL')} FAIL" + (f", {v.count('n/a')} n/a" if "n/a" in v else "")


def anchor(title: str) -> str:
    keep = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return keep.replace(" ", "-")


def unregistered(key: str) -> Bench:
    """A bench with records but no entry in bench_text.BENCHES: shown under its key, asking for one."""
    what = f"No description yet: add `Bench({key!r}, ...)` to bench/bench_text.py."
    return Bench(key, f"bench/{key}.py", "(not registered)", what, f".venv/bin/python bench/{key}.py")


def render(records: list[dict]) -> str:
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(str(r["bench"]), []).append(r)
    known = {b.key for b in BENCHES}
    benches = [*BENCHES, *(unregistered(k) for k in sorted(by) if k not in known)]
    lines = HEADER.splitlines() + ["", "| bench | the question | latest run | targets |", "|---|---|---|---|"]
    for b in benches:
        latest, _ = pick(by.get(b.key, []))
        when = str(latest["date"])[:10] + (" (partial)" if latest.get("partial") else "") if latest else "no record"
        lines.append(
            f"| [{b.title}](#{anchor(b.title)}) | {b.question} | {when} | {verdicts([latest] if latest else [])} |"
        )
    lines.append("")
    for b in benches:
        recs = by.get(b.key, [])
        latest, earlier = pick(recs)
        lines += [f"## {b.title}", "", f"{b.what} Reproduce: `{b.command}`", ""]
        shown = [p for p in PLOTS if p.bench == b.key and p.has_data(by)]
        lines += [ln for p in shown for ln in (f"![{p.caption}](img/bench/{p.name})", "")]
        covers = [p.covers for p in shown if p.covers and p.source(by) is latest]
        if latest:
            heading = ("Latest run" if latest is recs[-1] else "Latest full run") + (
                " (partial: a subset of the configurations)" if latest.get("partial") else ""
            )
            lines += run_lines(latest, heading, (lambda t: any(c(t) for c in covers)) if covers else None)
        if earlier:
            lines += [earlier_line(earlier), ""]
        if not recs:
            lines += ["No record is committed yet.", ""]
    lines += FOOTER.splitlines()
    return "\n".join(lines).rstrip() + "\n"


def write_plots(records: list[dict], folder: Path) -> list[str]:
    """Draw every plot whose data exists; the names of those that lack data."""
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(str(r["bench"]), []).append(r)
    folder.mkdir(parents=True, exist_ok=True)
    lacking = []
    for p in PLOTS:
        if p.has_data(by):
            p.draw(by, folder / p.name)
        else:
            lacking.append(p.name)
    return lacking


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare the page with the records")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--page", type=Path, default=PAGE)
    a = ap.parse_args(argv)
    records = load(a.results)
    text = render(records)
    if a.check:
        same = a.page.exists() and a.page.read_text() == text
        print("docs/benchmarks.md matches the records" if same else "docs/benchmarks.md differs: run bench/render.py")
        return 0 if same else 1
    a.page.write_text(text)
    lacking = write_plots(records, a.page.parent / "img" / "bench")
    print(f"wrote {a.page} ({len(text.splitlines())} lines)")
    for name in lacking:
        print(f"plot {name}: no record holds its data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
