"""One record per bench run: what ran, its figures, its targets with verdicts, and the machine.

Every bench in bench/ ends by writing one JSON record through ``write`` into ``bench/results/<bench>/``
(``--results DIR`` or ``$BMOE_BENCH_RESULTS`` elsewhere). bench/render.py renders docs/benchmarks.md
from the committed records, so a figure on that page is always one a run wrote. A record is small:
the tables a reader compares and the targets, never a trace; the bench's own JSON under ``--work``
keeps every raw number.

The shape (``SCHEMA``)::

    {"schema", "bench", "date" (UTC, ISO), "commit", "command", "partial" (a subset of the bench ran),
     "config": {...}, "machine": {...},
     "tables": [{"title", "columns": [[key, label, format]], "rows": [{key: value}],
                 "baseline": {"row", "key", "label"} | null}],
     "targets": [{"target", "value", "goal", "verdict": "PASS"|"FAIL"|"n/a"}],
     "notes": [str], "source": str}

``baseline`` names the row of the same table that the renderer divides ``key`` by, for every row
(a ratio column labelled ``label``). ``machine["load_avg"]`` is ``{"start", "end"}``, each the
1-, 5- and 15-minute load averages at the run's start (this module's import) and at ``record()``:
the machine is shared, and a busy one moves the times. ``config["short_run"]``, when present, is
``$BMOE_BENCH_SHORT``: why the run was cut shorter than the bench's defaults. A machine fact that could not be read is ``"unknown"``, with
the reason in ``machine["notes"]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SCHEMA = "bmoe-bench-record/1"
UNKNOWN = "unknown"
# The load average (1, 5, 15 minutes) when the bench imported this module, i.e. at the run's start;
# record() adds the one at its end, so a reader sees how busy the shared machine was meanwhile.
START_LOAD = [round(x, 2) for x in os.getloadavg()]
# The CPU flags that decide llama.cpp's kernels (x86 and Arm); the rest of /proc/cpuinfo's list is noise here.
FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "asimd",
    "asimddp",
    "sve",
    "i8mm",
)


def add_args(ap: argparse.ArgumentParser) -> None:
    """The option every bench takes: where its record goes."""
    ap.add_argument(
        "--results",
        type=Path,
        default=None,
        help="folder of the run's record (default $BMOE_BENCH_RESULTS, else bench/results)",
    )


def _cpuinfo() -> tuple[str, list[str]]:
    model, flags = platform.processor() or UNKNOWN, []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model name") and model in (UNKNOWN, "", platform.machine()):
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                have = set(value.split())
                flags = [f for f in FLAGS if f in have]
    except OSError:
        pass
    return model, flags


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _disk_rate(path: Path | None) -> float | str:
    """MiB/s bmoe's disk probe measured on ``path``'s file system (remembered under the cache
    folder, as the plan keeps it), or "unknown" where no probe ran there."""
    path = path or HERE
    from bmoe.stream.disk_rate import RATES_FILE, file_system_key
    from bmoe.stream.twin import default_twin_dir

    try:
        key = file_system_key(path)
        rates = json.loads((default_twin_dir().parent / RATES_FILE).read_text())
        return round(float(rates[key]["mib_s"]), 1)
    except (OSError, ValueError, KeyError, TypeError):
        return UNKNOWN


def machine(disk: Path | None = None, model: Path | None = None) -> dict[str, object]:
    """The facts a figure depends on. ``model``: a GGUF whose file system's read rate is probed
    (64 MiB, then remembered) when none is known; ``disk``: a path whose remembered rate is used."""
    from bmoe.stream.budget import cgroup_memory

    cpu, flags = _cpuinfo()
    notes = []
    if model is not None and _disk_rate(model) == UNKNOWN:
        from bmoe.stream import read_layout
        from bmoe.stream.disk_rate import read_rate
        from bmoe.stream.twin import default_twin_dir

        read_rate(read_layout(model), default_twin_dir().parent)
    rate = _disk_rate(model or disk)
    if rate == UNKNOWN:
        notes.append("disk_read_mib_s: no disk probe has run on this file system")
    try:
        mem = next(
            int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")
        )
        mem_gib: float | str = round(mem / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        mem_gib = UNKNOWN
    cg = cgroup_memory()
    try:
        from importlib.metadata import version

        llama = version("llama_cpp_python")
    except Exception:  # noqa: BLE001 - a missing distribution is only a missing fact
        llama = UNKNOWN
    return {
        "cpu": cpu,
        "cpu_flags": flags,
        "cores": _cores(),
        "mem_gib": mem_gib,
        "mem_limit_mib": None if cg is None else cg[0] // 2**20,
        "disk_read_mib_s": rate,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "llama_cpp_python": llama,
        "notes": notes,
    }


def commit() -> str:
    """The checked-out commit (short), with "+dirty" when src/ or bench/ have uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=7", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src", "bench"], cwd=HERE.parent, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return UNKNOWN
    return head + ("+dirty" if dirty else "")


def table(
    title: str,
    columns: Sequence[tuple[str, str, str]],
    rows: Sequence[dict[str, object]],
    baseline: dict[str, str] | None = None,
) -> dict[str, object]:
    """A table of a record. ``columns``: (key, label, format spec); ``baseline``: {"row": name of
    the row divided by, "key": the column, "label": the ratio column's label}."""
    return {"title": title, "columns": [list(c) for c in columns], "rows": list(rows), "baseline": baseline}


def figures(title: str, values: dict[str, object]) -> dict[str, object]:
    """A table of named scalar figures (a bench whose result is a handful of numbers, not rows);
    nested dicts are flattened one level as ``outer.inner``, lists are left out (traces)."""
    rows: list[dict[str, object]] = []
    for k, v in values.items():
        if isinstance(v, dict):
            rows += [{"name": f"{k}.{k2}", "value": v2} for k2, v2 in v.items() if not isinstance(v2, (list, dict))]
        elif not isinstance(v, list):
            rows.append({"name": k, "value": v})
    return table(title, (("name", "figure", ""), ("value", "value", "")), rows)


def target(name: str, value: object, goal: str, ok: bool | None) -> dict[str, object]:
    return {
        "target": name,
        "value": value,
        "goal": goal,
        "verdict": "n/a" if ok is None else ("PASS" if ok else "FAIL"),
    }


def invocation(script: str, argv: Sequence[str] | None = None) -> str:
    """The command line a record names: ``python bench/<script>`` and the run's arguments
    (``argv`` where the bench was called from Python, else the process's)."""
    return " ".join(["python", f"bench/{script}", *(sys.argv[1:] if argv is None else argv)])


def record(
    bench: str,
    *,
    command: str,
    config: dict[str, object],
    tables: Sequence[dict[str, object]],
    targets: Sequence[dict[str, object]] = (),
    notes: Sequence[str] = (),
    partial: bool = False,
    machine_facts: dict[str, object] | None = None,
) -> dict[str, object]:
    config = dict(config)
    if os.environ.get("BMOE_BENCH_SHORT"):  # a run cut short on purpose says so, and why
        config["short_run"] = os.environ["BMOE_BENCH_SHORT"]
    facts = dict(machine_facts if machine_facts is not None else machine())
    facts["load_avg"] = {"start": START_LOAD, "end": [round(x, 2) for x in os.getloadavg()]}
    return {
        "schema": SCHEMA,
        "bench": bench,
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "commit": commit(),
        "command": command,
        "partial": partial,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in config.items()},
        "machine": facts,
        "tables": list(tables),
        "targets": list(targets),
        "notes": list(notes),
        "source": "written by the run",
    }


def write(rec: dict[str, object], results: Path | None = None) -> Path:
    """Write ``rec`` as ``<results>/<bench>/<date>.json`` (a second run in the same minute gets a suffix)."""
    base = results or Path(os.environ.get("BMOE_BENCH_RESULTS") or RESULTS)
    folder = base / str(rec["bench"])
    folder.mkdir(parents=True, exist_ok=True)
    stem = str(rec["date"]).replace(":", "")
    path, n = folder / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.json"
    path.write_text(json.dumps(rec, indent=1, sort_keys=False) + "\n")
    print(f"record:  {path}", file=sys.stderr)
    return path


def load(results: Path = RESULTS) -> list[dict[str, object]]:
    """Every record under ``results``, oldest first (by date, then file name)."""
    recs = []
    for path in sorted(results.glob("*/*.json")):
        rec = json.loads(path.read_text())
        rec["path"] = Path(os.path.relpath(path.resolve(), HERE.parent)).as_posix()
        recs.append(rec)
    return sorted(recs, key=lambda r: (str(r["date"]), str(r["path"])))
