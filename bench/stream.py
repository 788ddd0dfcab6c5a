"""Benchmark: bmoe expert streaming against llama.cpp's own mmap load, on a model bigger than RAM.

One run, side by side, on a synthetic Qwen3-30B-A3B-shaped qwen3moe (16 layers, Q4_0, ~5.7 GB;
bench/synthetic_moe.py):

  under a cgroup-v1 memory limit (default 2.5 GiB), page cache dropped before each run:
    llama.cpp default load (repacked "extra" buffers)  -- expected OOM-killed at load
    llama.cpp mmap, use_extra_bufts off
    bmoe streamed, cache off
    bmoe streamed, cache off, --prefetch (the next layer's guessed experts read early)
    bmoe streamed, --cache-mb N
  without a limit, warm, in one process, decoding in turns:
    plain llama.cpp mmap vs resident bmoe

and prints the targets as PASS/FAIL (never asserted: the machine is shared and noisy). Each
configuration runs in its own process (bench/stream_child.py). Needs root for the cgroup and
drop_caches. docs/benchmarks.md explains every number.

    .venv/bin/python bench/stream.py [--work bench/out] [--cache-mb 1024] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import record
from bench_records import stream_tables
from cgroup_run import drop_caches, run_limited
from record import machine
from stream_report import derive, print_table, render_chart, targets
from synthetic_moe import write_synthetic


def load_avg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def time_layout(model: Path) -> dict[str, float]:
    """Cold header parse: bmoe's header walk vs gguf.GGUFReader (what read_layout used before)."""
    import gguf

    from bmoe.stream import read_layout

    out = {}
    drop_caches()
    t0 = time.perf_counter()
    read_layout(model)
    out["read_layout_s"] = time.perf_counter() - t0
    drop_caches()
    t0 = time.perf_counter()
    gguf.GGUFReader(model, "r")
    out["gguf_reader_s"] = time.perf_counter() - t0
    return out


def make_twin(model: Path, twins: Path) -> dict[str, float]:
    """The dense twin is written once per model; write it now so no run's load pays for it."""
    from bmoe.stream import dense_twin, read_layout

    layout = read_layout(model)
    t0 = time.perf_counter()
    dense_twin(layout, twins)
    return {
        "twin_s": time.perf_counter() - t0,
        "dense_mib": layout.dense_nbytes / 2**20,
        "expert_mib": layout.expert_nbytes / 2**20,
        "floor_mib": layout.floor_bytes() / 2**20,
        "file_mib": layout.files[0].size / 2**20,
    }


def child(mode: str, model: Path, out: Path, a: argparse.Namespace, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(HERE / "stream_child.py"),
        mode,
        "--model",
        str(model),
        "--out",
        str(out),
        "--threads",
        str(a.threads),
        "--io-threads",
        str(a.io_threads),
        "--twins",
        str(a.work / "twins"),
        *extra,
    ]


def run_one(
    name: str,
    cmd: list[str],
    out: Path,
    limit: int | None,
    a: argparse.Namespace,
    *,
    cold: bool,
    timeout_s: float,
    tag: str | None = None,
) -> dict[str, object]:
    """Run one child (under ``limit`` bytes, None: no cgroup; ``cold``: caches dropped first) and
    return its outcome with its JSON (``result``) or the tail of its stderr."""
    out.unlink(missing_ok=True)
    before = load_avg()
    print(f"[{time.strftime('%H:%M:%S')}] {name} (load {before[0]:.1f}) ...", flush=True)
    o = run_limited(cmd, limit, timeout_s=timeout_s, cold=cold, tag=tag or name.split()[0])
    rec: dict[str, object] = {
        "name": name,
        "returncode": o.returncode,
        "wall_s": o.wall_s,
        "oom_killed": o.oom_killed,
        "cgroup_peak_mib": o.max_usage_mib,
        "loadavg_before": before,
        "loadavg_after": load_avg(),
    }
    if o.returncode == 0 and out.is_file():
        rec["result"] = json.loads(out.read_text())
    else:
        rec["stderr_tail"] = o.stderr_tail
        print(
            f"    {'OOM-killed' if o.oom_killed else 'failed'} (rc {o.returncode}) after {o.wall_s:.1f} s: "
            f"{o.stderr_tail[-300:]}",
            flush=True,
        )
    return rec


def median_round(rates: list[float]) -> int:
    """The round a row reports: the median by decode rate; of an even number, the slower of the two
    in the middle (a row's figures all come from one round, so no average of two)."""
    return sorted(range(len(rates)), key=rates.__getitem__)[(len(rates) - 1) // 2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=HERE / "out", help="model, twin and results folder")
    ap.add_argument("--limit-mib", type=int, default=2560, help="memory limit of the limited runs")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads (both engines)")
    ap.add_argument("--io-threads", type=int, default=8, help="bmoe read lanes")
    ap.add_argument("--cache-mb", type=int, default=1024, help="budget of the cached streamed run")
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated by the streamed runs")
    ap.add_argument("--llama-tokens", type=int, default=6, help="tokens generated by llama.cpp mmap (slow)")
    ap.add_argument("--resident-tokens", type=int, default=64, help="tokens per round, warm comparison")
    ap.add_argument("--repeats", type=int, default=5, help="rounds of the warm comparison")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the limited runs (median reported)")
    ap.add_argument(
        "--all-cached-mb",
        type=int,
        default=5400,
        help="warm comparison: also a streamed session with this cache (0: leave it out)",
    )
    ap.add_argument("--skip-oom-demo", action="store_true", help="do not run llama.cpp's default (repacking) load")
    ap.add_argument(
        "--only", nargs="*", default=None, help="subset: oom llama off prefetch cache paired (default: all)"
    )
    ap.add_argument("--out", type=Path, default=None, help="JSON results (default WORK/stream-bench.json)")
    ap.add_argument("--chart", type=Path, default=None, help="PNG chart (default WORK/stream-bench.png)")
    record.add_args(ap)
    a = ap.parse_args(argv)
    a.work = a.work.resolve()
    only = set(a.only) if a.only else {"oom", "llama", "off", "prefetch", "cache", "paired"}
    if a.skip_oom_demo:
        only.discard("oom")
    if os.geteuid() != 0:
        ap.error("needs root: memory cgroups and /proc/sys/vm/drop_caches")

    t0 = time.perf_counter()
    model = write_synthetic(a.work)
    report: dict[str, object] = {
        "command": " ".join(
            [Path(sys.executable).name, "bench/stream.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "machine": machine(model=model),
        "model": {
            "path": str(model),
            "write_or_reuse_s": time.perf_counter() - t0,
            **make_twin(model, a.work / "twins"),
        },
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "layout": time_layout(model),
        "runs": {},
    }
    runs: dict[str, object] = report["runs"]  # type: ignore[assignment]
    limit = a.limit_mib * 2**20
    res = a.work / "child.json"
    if "oom" in only:
        runs["oom"] = run_one(
            "llama.cpp default load (extra bufts)",
            child("llama", model, res, a, "--extra-bufts", "--n-predict", "3"),
            res,
            limit,
            a,
            cold=True,
            timeout_s=300,
        )
    limited = {
        "llama": ("llama.cpp mmap", child("llama", model, res, a, "--n-predict", str(a.llama_tokens)), 900),
        "off": ("bmoe cache off", child("bmoe", model, res, a, "--cache-mb", "0", "--n-predict", str(a.tokens)), 600),
        "prefetch": (
            "bmoe cache off, prefetch",
            child("bmoe", model, res, a, "--cache-mb", "0", "--prefetch", "--n-predict", str(a.tokens)),
            600,
        ),
        "cache": (
            f"bmoe cache {a.cache_mb}",
            child("bmoe", model, res, a, "--cache-mb", str(a.cache_mb), "--n-predict", str(a.tokens)),
            600,
        ),
    }
    # Rounds run the three in turn, so a burst of load from other jobs hits all of them alike;
    # each row then reports its median round.
    tries: dict[str, list[dict[str, object]]] = {k: [] for k in limited if k in only}
    for _ in range(a.rounds):
        for key, recs in tries.items():
            name, cmd, timeout_s = limited[key]
            recs.append(run_one(name, cmd, res, limit, a, cold=True, timeout_s=timeout_s))
    for key, recs in tries.items():
        rates = [float(r["result"]["decode_tok_s"]) if "result" in r else 0.0 for r in recs]  # type: ignore[index]
        runs[key] = recs[median_round(rates)] | {"round_tok_s": rates}
    if "paired" in only:
        cached = ["--cache-mb", str(a.all_cached_mb)] if a.all_cached_mb else []
        runs["paired"] = run_one(
            "warm resident pair",
            child("paired", model, res, a, "--n-predict", str(a.resident_tokens), "--repeats", str(a.repeats), *cached),
            res,
            None,
            a,
            cold=False,
            timeout_s=1500,
        )
    report["derived"] = derive(runs)
    report["targets"] = targets(report["derived"])
    report["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    out = a.out or a.work / "stream-bench.json"
    out.write_text(json.dumps(report, indent=1))
    print_table(report)
    rec = record.record(
        "stream",
        command=str(report["command"]),
        config=report["settings"],  # type: ignore[arg-type]
        tables=stream_tables(report["derived"]),  # type: ignore[arg-type]
        targets=report["targets"],  # type: ignore[arg-type]
        partial=only
        != {"oom", "llama", "off", "prefetch", "cache", "paired"} - ({"oom"} if a.skip_oom_demo else set()),
        machine_facts=report["machine"],  # type: ignore[arg-type]
    )
    record.write(rec, a.results)
    chart = a.chart or a.work / "stream-bench.png"
    try:
        render_chart(report, chart)
    except ImportError as e:  # the chart needs the bench extra; the results are written already
        print(f"\nresults: {out}\nchart:   skipped ({e.name} is missing: pip install -e '.[bench]')")
        return 0
    print(f"\nresults: {out}\nchart:   {chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
