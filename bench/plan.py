"""Benchmark (issue #29): the plan against the best hand-picked configuration, under memory limits.

For each routing preset of the synthetic Qwen3-30B-A3B-shaped model (bench/synthetic_moe.py), first
the compute floor: ``--floor-rounds`` runs of the model resident with no limit. Then, for each
memory limit (GiB; 0 for none), bench/decide_stream.py's run of, in the same run and page cache
dropped before each child:

    bmoe planned        no streaming, thread or batch flag: what the plan chooses (docs/plan.md)
    the grid            bmoe cache off, ~15% and ~30% of the expert bytes, each with read-ahead,
                        and ~30% without (decide_stream's keys off+ra cache15+ra cache30+ra cache30)

and then the long-prompt decision (``--long-lines`` screen elements, ~1300 tokens, on the kept
prefix, n_ctx 2048) by the planned configuration and by the grid's fastest in decisions.

Per limit: the median decision latency (decisions 2..N of an agent's sequence on a kept prefix),
the decode rate after them, each configuration's cgroup peak and OOM kills, what the plan chose,
the planned configuration's ratio to the best of the grid, the read-ahead configurations' ratio to
their bound (the slower of the I/O bound and the compute floor), and the long decision's time and
bytes. Targets (PASS/FAIL, never asserted): the plan within 1.15x of the grid's best in decisions
and in decode, never OOM-killed, resident with no limit; every read-ahead configuration within
1.2x of its bound (decide_stream's target as #29 restated it). Needs root (cgroups, drop_caches).
docs/benchmarks.md "The plan" holds a recorded run.

    .venv/bin/python bench/plan.py [--limits 0.75 1 1.25 1.5 2 2.5 4 8 0] [--preset uniform trace] [--decisions 5]
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

import bench_records as br  # noqa: E402
import decide_stream as ds  # noqa: E402
import record  # noqa: E402

RATIO_MAX = 1.15
GRID = ("off+ra", "cache15+ra", "cache30+ra", "cache30")
GRID_RA = tuple(k for k in GRID if k.endswith("+ra"))


def _ratio(planned: float | None, best: float | None) -> float | None:
    return planned / best if planned and best else None


def compare(rec: dict[str, object], limit_gib: float) -> dict[str, object]:
    """The planned configuration against the grid's best at one limit: latency (lower is better)
    and decode rate (higher is better), with the verdicts."""
    cfgs: dict[str, dict] = rec["configs"]  # type: ignore[assignment]
    summ = {k: (v.get("summary") or {}) for k, v in cfgs.items()}
    grid = {k: s for k, s in summ.items() if k not in ("planned", "llama") and s}
    llama = summ.get("llama") or {}  # llama.cpp mmap, the baseline (with --grid llama), not a grid choice
    planned = summ.get("planned") or {}
    lat = {k: s.get("latency_s") for k, s in grid.items() if s.get("latency_s")}
    dec = {k: s.get("decode_tok_s") for k, s in grid.items() if s.get("decode_tok_s")}
    best_lat = min(lat.items(), key=lambda kv: kv[1]) if lat else (None, None)
    best_dec = max(dec.items(), key=lambda kv: kv[1]) if dec else (None, None)
    r_lat = _ratio(planned.get("latency_s"), best_lat[1])
    r_dec = _ratio(best_dec[1], planned.get("decode_tok_s"))  # >1: the planned one decodes slower
    plan = cfgs.get("planned", {}).get("plan") or {}
    ooms = {k: v.get("oom_killed", 0) for k, v in cfgs.items() if v.get("oom_killed")}
    verdicts = {
        "decisions": None if r_lat is None else r_lat <= RATIO_MAX,
        "decode": None if r_dec is None else r_dec <= RATIO_MAX,
        "never OOM-killed": not ooms.get("planned"),
    }
    if not limit_gib:
        verdicts["resident with no limit"] = plan.get("mode") == "resident"
    return {
        "limit_gib": limit_gib or None,
        "planned_latency_s": planned.get("latency_s"),
        "planned_decode_tok_s": planned.get("decode_tok_s"),
        "llama_latency_s": llama.get("latency_s"),
        "llama_decode_tok_s": llama.get("decode_tok_s"),
        "best_latency": best_lat,
        "best_decode": best_dec,
        "latency_ratio": r_lat,
        "decode_ratio": r_dec,
        "plan_mode": plan.get("mode"),
        "plan_settings": {k: v.get("value") for k, v in (plan.get("settings") or {}).items()},
        "cgroup_peak_mib": {k: v.get("cgroup_peak_mib") for k, v in cfgs.items()},
        "oom_killed": ooms,
        "verdicts": {k: ("n/a" if v is None else "PASS" if v else "FAIL") for k, v in verdicts.items()},
    }


def bound_rows(rec: dict[str, object]) -> dict[str, dict[str, object]]:
    """The read-ahead configurations' decision latency against their bound, from decide_stream's
    targets of this limit (``key vs its bound ...``), keyed by configuration."""
    out = {}
    for t in rec.get("targets") or []:  # type: ignore[union-attr]
        name = str(t["target"])
        if " vs its bound" in name:
            out[name.split(" vs its bound")[0]] = {"ratio": t["value"], "verdict": t["verdict"]}
    return out


def long_row(recs: dict[str, dict[str, object]]) -> dict[str, object]:
    """The long-prompt decision of each configuration that ran it: time, tokens, bytes, ubatch."""
    out = {}
    for key, r in recs.items():
        res = r.get("result") or {}
        lg = res.get("long") if isinstance(res, dict) else None
        out[key] = (
            {
                "latency_s": lg["latency_s"],
                "n_tokens": lg["n_tokens"] - lg["n_reused"],
                "read_mib": lg["read_bytes"] / ds.MIB if lg.get("read_bytes") else lg["proc_read_bytes"] / ds.MIB,
                "n_ubatch": lg["n_ubatch"],
                "cgroup_peak_mib": r.get("cgroup_peak_mib"),
            }
            if lg
            else {"status": "OOM-killed" if r.get("oom_killed") else f"failed rc {r.get('returncode')}"}
        )
    return out


def _f(v: object, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def print_rows(rows: list[dict[str, object]], preset: str) -> None:
    print(f"\n## {preset}\n")
    print(
        "| limit | plan | planned decision s | best grid decision s | ratio | planned decode tok/s | "
        "best grid decode tok/s | ratio | planned cgroup peak MiB | verdicts |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["plan_settings"]
        plan = f"{r['plan_mode']}" + (
            f", cache {s.get('cache_mb')} MiB, read-ahead {s.get('prefetch')}, ub {s.get('n_ubatch')}"
            if r["plan_mode"] == "streamed"
            else ""
        )
        bl, bd = r["best_latency"], r["best_decode"]
        print(
            f"| {_f(r['limit_gib'], '{:g} GiB') if r['limit_gib'] else 'none'} | {plan} | "
            f"{_f(r['planned_latency_s'])} | {_f(bl[1])} ({bl[0]}) | {_f(r['latency_ratio'])} | "
            f"{_f(r['planned_decode_tok_s'])} | {_f(bd[1])} ({bd[0]}) | {_f(r['decode_ratio'])} | "
            f"{_f(r['cgroup_peak_mib'].get('planned'), '{:.0f}')} | "
            + ", ".join(f"{k} {v}" for k, v in r["verdicts"].items())
            + " |"
        )
    print(
        "\nRead-ahead configurations against their bound (decision latency / the slower of the I/O bound "
        "and the compute floor; target <= 1.2x):\n"
    )
    print("| limit | " + " | ".join(GRID_RA) + " |")
    print("|---|" + "---|" * len(GRID_RA))
    for r in rows:
        b = r.get("bounds") or {}
        print(
            f"| {_f(r['limit_gib'], '{:g} GiB') if r['limit_gib'] else 'none'} | "
            + " | ".join(
                f"{_f((b.get(k) or {}).get('ratio'))} {(b.get(k) or {}).get('verdict', '')}".strip() for k in GRID_RA
            )
            + " |"
        )
    if any(r.get("long") for r in rows):
        print("\nThe long-prompt decision (one decision, its suffix's tokens prefilled on the kept prefix):\n")
        print("| limit | configuration | suffix tokens | ubatch | latency s | MiB read |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            for key, lg in (r.get("long") or {}).items():
                print(
                    f"| {_f(r['limit_gib'], '{:g} GiB') if r['limit_gib'] else 'none'} | {key} | "
                    f"{lg.get('n_tokens', '-')} | {lg.get('n_ubatch', '-')} | {_f(lg.get('latency_s'))} | "
                    f"{_f(lg.get('read_mib'), '{:.0f}')} |"
                    if "latency_s" in lg
                    else f"| {_f(r['limit_gib'], '{:g} GiB') if r['limit_gib'] else 'none'} | {key} | {lg['status']} | | | |"
                )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=HERE / "out")
    ap.add_argument(
        "--limits", nargs="+", type=float, default=[0.75, 1, 1.25, 1.5, 2, 2.5, 4, 8, 0], help="GiB; 0: no limit"
    )
    ap.add_argument("--preset", nargs="+", default=["uniform", "trace"])
    ap.add_argument("--floor-rounds", type=int, default=4, help="resident runs (no limit) the compute floor takes")
    ap.add_argument(
        "--long-lines",
        type=int,
        default=55,
        help="screen elements of the long-prompt decision (55: ~1300 tokens); 0: none",
    )
    ap.add_argument(
        "--grid",
        nargs="+",
        default=list(GRID),
        help="decide_stream configurations to beat; llama adds llama.cpp mmap as the baseline (never the grid's best)",
    )
    ap.add_argument("--decisions", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--io-threads", type=int, default=8)
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--spec-layers", type=int, default=None, help="smoke runs: the preset's model with N layers")
    ap.add_argument("--timeout", type=float, default=1800)
    record.add_args(ap)
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        ap.error("needs root: memory cgroups and /proc/sys/vm/drop_caches")
    a.work = a.work.resolve()
    a.work.mkdir(parents=True, exist_ok=True)
    # what decide_stream.run_preset reads besides these
    a.flash_attn, a.probe_mib, a.wide_tokens, a.cache_pct = "auto", 512, 0, list(ds.DEFAULT_CACHE_PCT)
    configs = [ds.Config("planned", "planned")] + ds.plan(tuple(a.cache_pct), set(a.grid))
    report: dict[str, object] = {
        "command": record.invocation("plan.py", argv),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "machine": record.machine(disk=a.work),
        "presets": {},
    }
    for preset in a.preset:
        rows = []
        model = ds.model_for(a.work, preset, a.spec_layers)
        res = a.work / "decide-stream-child.json"
        a.limit_gib = 0
        floor = [
            ds.run_child(
                f"{preset} resident floor round {i + 1}",
                ds.child_cmd("bmoe", model, res, a, "--resident", "--decode-tokens", str(a.decode_tokens)),
                res,
                a,
                limit=False,
            )
            for i in range(a.floor_rounds)
        ]
        floor_results = [f["result"] for f in floor if "result" in f]
        for limit in a.limits:
            a.limit_gib = limit
            rec = ds.run_preset(preset, a, configs, floor_results)
            row = {**compare(rec, limit), "bounds": bound_rows(rec), "run": rec}
            if a.long_lines:  # the long prompt: the plan (its ubatch) against the grid's fastest in decisions
                long_cmd = ("--decisions", "1", "--n-ctx", "2048", "--long-lines", str(a.long_lines))
                best = row["best_latency"][0]
                runs = {}
                for key in ("planned", best):
                    if key is None:
                        continue
                    c = next(c for c in configs if c.key == key)
                    extra = ds.config_args(c, a, int(rec["model"]["expert_mib"] * ds.MIB)) + list(long_cmd)
                    runs[key] = ds.run_child(
                        f"{preset} {c.name} long prompt",
                        ds.child_cmd("bmoe", model, res, a, *extra),
                        res,
                        a,
                        limit=True,
                    )
                row["long"] = long_row(runs)
                row["long_runs"] = runs
            rows.append(row)
        report["presets"][preset] = {"floor": floor, "limits": rows}  # type: ignore[index]
        print_rows(rows, preset)
    report["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    out = a.work / "plan.json"
    out.write_text(json.dumps(report, indent=1, default=str))
    presets = report["presets"]  # type: ignore[assignment]
    rec = record.record(
        "plan",
        command=str(report["command"]),
        config={k: v for k, v in vars(a).items() if k not in ("limit_gib",)},
        tables=br.plan_tables(presets),  # type: ignore[arg-type]
        targets=br.plan_targets(presets),  # type: ignore[arg-type]
        # a smaller model, grid, set of limits or presets than the defaults: a partial run
        partial=a.spec_layers is not None or any(vars(a)[k] != ap.get_default(k) for k in ("grid", "limits", "preset")),
        machine_facts=report["machine"],  # type: ignore[arg-type]
    )
    record.write(rec, a.results)
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
