"""Each bench's report (the raw JSON it keeps under --work) cut down to the tables of its record
(bench/record.py): the rows a reader compares, in the keys bench/render.py and bench/plots.py read."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from record import table, target

F0, F1, F2, F3 = ".0f", ".1f", ".2f", ".3f"
LIMITED = (("oom", None), ("llama", None), ("off", None), ("prefetch", None), ("cache", None))
STREAM_COLS = (
    ("name", "run", ""),
    ("decode_tok_s", "decode tok/s", F2),
    ("prefill_tok_s", "prefill tok/s", F1),
    ("read_mib_per_tok", "MiB read/token", F1),
    ("hit_pct", "hit %", F1),
    ("bw_gbs", "read GB/s", F2),
    ("bound_tok_s", "I/O bound tok/s", F2),
    ("bound_ratio", "x I/O bound", F2),
    ("python_ms_per_tok", "Python ms/token", F2),
    ("mgmt_ms_per_tok", "bookkeeping ms/token", F2),
    ("load_s", "load s", F1),
)
WARM_COLS = (
    ("name", "run", ""),
    ("decode_tok_s", "decode tok/s", F2),
    ("prefill_tok_s", "prefill tok/s", F1),
    ("hit_pct", "hit %", F1),
    ("python_ms_per_tok", "Python ms/token", F2),
    ("mgmt_ms_per_tok", "bookkeeping ms/token", F2),
)
DS_COLS = (
    ("name", "config", ""),
    ("cache_mib", "cache MiB", F0),
    ("latency_s", "latency s", F2),
    ("read_mib", "MiB read", F0),
    ("hit_pct", "hit %", F1),
    ("bound_s", "bound s", F2),
    ("x_bound", "x bound", F2),
    ("decode_tok_s", "decode tok/s", F2),
)


def _pick(row: Mapping[str, object], keys: Sequence[str]) -> dict[str, object]:
    return {k: row.get(k) for k in keys}


def stream_tables(d: Mapping[str, dict]) -> list[dict[str, object]]:
    """bench/stream.py's derived rows: the limited runs against llama.cpp mmap, the warm ones against plain llama.cpp."""
    keys = [c[0] for c in STREAM_COLS]
    limited = []
    for key, _ in LIMITED:
        row = d.get(key)
        if row is None:
            continue
        if "decode_tok_s" in row:
            limited.append(_pick(row, keys) | {"rounds": row.get("round_tok_s")})
        else:
            limited.append({"name": row["name"], "status": f"{row.get('status')} after {row.get('wall_s', 0):.0f} s"})
    tables = [
        table(
            "Under the memory limit, cold (the median round)",
            STREAM_COLS,
            limited,
            {"row": "llama.cpp mmap", "key": "decode_tok_s", "label": "decode / llama.cpp mmap's"},
        )
    ]
    p = d.get("paired") or {}
    if p.get("status") == "ok":
        warm = [
            {
                "name": "plain llama.cpp (mmap)",
                "decode_tok_s": p["plain_median"],
                "prefill_tok_s": p["plain_prefill_median"],
            },
            {"name": "bmoe resident", "decode_tok_s": p["bmoe_median"], "prefill_tok_s": p["bmoe_prefill_median"]},
        ]
        if "cached_median" in p:
            warm.append(
                {
                    "name": "bmoe streamed, every expert cached",
                    "decode_tok_s": p["cached_median"],
                    "hit_pct": p["cached_hit_pct"],
                    "python_ms_per_tok": p["cached_python_ms"],
                    "mgmt_ms_per_tok": p["cached_mgmt_ms"],
                }
            )
        tables.append(
            table(
                "Warm, no limit, in one process (the median of the rounds)",
                WARM_COLS,
                warm,
                {"row": "plain llama.cpp (mmap)", "key": "decode_tok_s", "label": "decode / plain llama.cpp's"},
            )
        )
    return tables


def decide_stream_tables(presets: Mapping[str, dict]) -> list[dict[str, object]]:
    """bench/decide_stream.py: one table per preset, against its llama.cpp mmap row."""
    out = []
    for name, p in presets.items():
        rows = []
        for c in p["configs"].values():
            s = c.get("summary") or {}
            row: dict[str, object] = {
                "name": c["name"],
                "cache_mib": c.get("cache_mib"),
                "latency_s": s.get("latency_s"),
                "read_mib": s.get("read_mib"),
                "hit_pct": s.get("hit_pct"),
                "io_bound_s": s.get("io_bound_s"),
                "bound_s": s.get("bound_s"),
                "x_bound": s.get("bound_ratio"),
                "decode_tok_s": s.get("decode_tok_s"),
                "rss_mib": c.get("rss_mib"),
                "rss_anon_mib": c.get("anon_mib"),
            }
            if c.get("status") not in (None, "ok"):
                row["status"] = c["status"]
            rows.append(row)
        title = f"{name} (limit {p.get('limit_mib', 0):.0f} MiB; bounds at {p.get('bound_gbs') or 0:.2f} GB/s)"
        llama = next((c["name"] for c in p["configs"].values() if c.get("engine") == "llama"), None)
        base = {"row": llama, "key": "latency_s", "label": "latency / llama.cpp mmap's"} if llama else None
        out.append(table(title, DS_COLS, rows, base))
    return out


def decide_stream_targets(presets: Mapping[str, dict]) -> list[dict[str, object]]:
    out = []
    for p in presets.values():
        for t in p.get("targets") or []:
            rec = {
                "target": f"[{t['preset']}] {t['target']}",
                "value": t["value"],
                "goal": t["goal"],
                "verdict": t["verdict"],
            }
            if t.get("why"):
                rec["note"] = t["why"]
            out.append(rec)
    return out


def defaults_table(summary: Mapping[str, Mapping[str, object] | None]) -> dict[str, object]:
    rows = [{"name": k, **_pick(s or {}, ("latency_s", "decode_tok_s"))} for k, s in summary.items()]
    return table(
        "Flash attention and threads (medians of the decisions after the first)",
        (("name", "setting", ""), ("latency_s", "decision latency s", F2), ("decode_tok_s", "decode tok/s", F2)),
        rows,
    )


def plan_tables(presets: Mapping[str, dict]) -> list[dict[str, object]]:
    """bench/plan.py: per preset, the plan against the grid's best at each limit, in the keys the plots read."""
    out = []
    for name, p in presets.items():
        rows = []
        for r in p["limits"]:
            s = r.get("plan_settings") or {}
            mode = r.get("plan_mode")
            chose = (
                "resident"
                if mode == "resident"
                else f"cache {s.get('cache_mb')} MiB"
                + (", read-ahead" if s.get("prefetch") else "")
                + f", ubatch {s.get('n_ubatch')}"
            )
            long = r.get("long") or {}
            lp = long.get("planned") or {}
            grid_key = next((k for k in long if k != "planned"), None)
            lg = long.get(grid_key) or {} if grid_key else {}
            rows.append(
                {
                    "name": f"{r['limit_gib']:g} GiB" if r.get("limit_gib") else "none",
                    "limit_gib": r.get("limit_gib"),
                    "chose": chose,
                    "mode": mode,
                    "cache_mib": s.get("cache_mb") if mode != "resident" else None,
                    "readahead": bool(s.get("prefetch")),
                    "ubatch": s.get("n_ubatch"),
                    "planned_s": r.get("planned_latency_s"),
                    "best_grid_s": r["best_latency"][1],
                    "best_grid_config": r["best_latency"][0],
                    "planned_tok_s": r.get("planned_decode_tok_s"),
                    "llama_s": r.get("llama_latency_s"),
                    "llama_tok_s": r.get("llama_decode_tok_s"),
                    "best_grid_tok_s": r["best_decode"][1],
                    "best_grid_tok_config": r["best_decode"][0],
                    "long_planned_s": lp.get("latency_s"),
                    "long_grid": (
                        f"{grid_key}: {lg['n_ubatch']}, {lg['latency_s']:.2f} s, {lg['read_mib']:.0f} MiB"
                        if "latency_s" in lg
                        else f"{grid_key}: {lg.get('status')}"
                        if grid_key
                        else None
                    ),
                    "verdicts": r.get("verdicts"),
                }
            )
        out.append(
            table(
                f"{name}: the plan against the grid's best",
                (
                    ("name", "limit", ""),
                    ("chose", "the plan chose", ""),
                    ("planned_s", "planned decision s", F2),
                    ("best_grid_s", "best grid s", F2),
                    ("best_grid_config", "(config)", ""),
                    ("planned_tok_s", "planned decode tok/s", F2),
                    ("best_grid_tok_s", "best grid tok/s", F2),
                    ("llama_s", "llama.cpp mmap s", F2),
                    ("llama_tok_s", "llama.cpp mmap tok/s", F2),
                    ("long_planned_s", "long prompt s, planned", F1),
                    ("long_grid", "long prompt, grid's fastest", ""),
                ),
                rows,
                {"row": None, "key": "planned_s", "over": "best_grid_s", "label": "planned / best grid (decisions)"},
            )
        )
    return out


def plan_targets(presets: Mapping[str, dict]) -> list[dict[str, object]]:
    out = []
    for name, p in presets.items():
        for r in p["limits"]:
            limit = f"{r['limit_gib']:g} GiB" if r.get("limit_gib") else "no limit"
            for what, verdict in (r.get("verdicts") or {}).items():
                value = {"decisions": r.get("latency_ratio"), "decode": r.get("decode_ratio")}.get(what)
                goal = "<= 1.15x of the grid's best" if what in ("decisions", "decode") else "yes"
                out.append({"target": f"[{name}, {limit}] {what}", "value": value, "goal": goal, "verdict": verdict})
    return out


def decide_batch_table(report: Mapping[str, object]) -> dict[str, object]:
    rows: list[dict[str, object]] = []
    for r in report.get("streamed") or []:  # type: ignore[attr-defined]
        if "compute_floor_s" in r:
            rows.append({"name": "compute floor (resident, warm, batched)", "batched_s": r["compute_floor_s"]})
            continue
        b, s = r["batched"], r["one_by_one"]
        rows.append(
            {
                "name": f"streamed, cache {r['cache_mb'] or 'off'}",
                "batched_s": b["wall_s"],
                "one_by_one_s": s["wall_s"],
                "speedup": s["wall_s"] / b["wall_s"],
                "read_batched_mib": b["read_bytes"] / 2**20,
                "read_one_by_one_mib": s["read_bytes"] / 2**20,
                "bytes_saved": s["read_bytes"] / max(1, b["read_bytes"]),
            }
        )
    res = report.get("resident")
    if isinstance(res, dict) and res.get("batched_s") and res.get("one_by_one_s"):
        b, o = statistics.median(res["batched_s"]), statistics.median(res["one_by_one_s"])
        rows.append(
            {"name": "resident SmolLM2 (median of the rounds)", "batched_s": b, "one_by_one_s": o, "speedup": o / b}
        )
    return table(
        "decide_many against decide one by one",
        (
            ("name", "run", ""),
            ("batched_s", "batched s", F2),
            ("one_by_one_s", "one by one s", F2),
            ("speedup", "speed-up", F2),
            ("read_batched_mib", "MiB read batched", F0),
            ("read_one_by_one_mib", "MiB read one by one", F0),
            ("bytes_saved", "bytes saved", F1),
        ),
        rows,
        {"row": "compute floor (resident, warm, batched)", "key": "batched_s", "label": "batched / compute floor"},
    )


SIZES_TITLE = "Seconds per decision by batch size"


def decide_sizes_table(report: Mapping[str, Mapping[str, object]], n: int) -> dict[str, object]:
    """bench/decide_batch.py sizes: per batch size, the streamed run (cache off, one process) and
    resident SmolLM2 (the median of its rounds, with their spread), both per decision."""
    streamed, resident = report.get("streamed") or {}, report.get("resident") or {}
    rows = []
    for k in sorted({int(k) for k in (*streamed, *resident)}):
        s, r = streamed.get(str(k)), resident.get(str(k))
        row: dict[str, object] = {"name": str(k), "batch": k}
        if isinstance(s, dict):
            row |= {"streamed_s": s["wall_s"] / n, "read_mib": s["read_bytes"] / n / 2**20}
        if isinstance(r, list) and r:
            med = statistics.median(r)
            row |= {"resident_s": med / n, "resident_spread": (max(r) - min(r)) / med}
        rows.append(row)
    return table(
        f"{SIZES_TITLE} ({n} decisions on a kept prefix)",
        (
            ("name", "batch size", ""),
            ("streamed_s", "streamed, cache off: s/decision", F2),
            ("read_mib", "MiB read/decision", F0),
            ("resident_s", "resident SmolLM2: s/decision", F3),
            ("resident_spread", "its rounds' spread", ".0%"),
        ),
        rows,
        {"row": "1", "key": "streamed_s", "label": "streamed / one by one"},
    )


REPLAY_COLS = (
    ("name", "budget MiB", ""),
    ("held_out", "bmoe", F1),
    ("lru", "LRU", F1),
    ("partition", "in-budget LFU partition", F1),
    ("optimal", "optimal", F1),
)


def replay_table(title: str, rows: Mapping[str, Mapping[str, float]], column: str = "bmoe") -> dict[str, object]:
    """bench/cache_replay.py: one trace's hit % per budget (``column``: the bmoe figure shown)."""
    out = []
    for budget, r in rows.items():
        row = {
            "name": budget,
            "budget_mib": float(budget),
            "held_out": r[column],
            **{k: r[k] for k in ("lru", "partition", "optimal")},
        }
        if "bmoe_defaults" in r:
            row["defaults"] = r["bmoe_defaults"]
        out.append(row)
    return table(title, REPLAY_COLS, out)


def replay_targets(
    model: str, rows: Mapping[str, Mapping[str, float]], column: str = "bmoe"
) -> list[dict[str, object]]:
    passed = [k for k, r in rows.items() if r[column] >= max(r["lru"], r["partition"])]
    failed = [k for k in rows if k not in passed]
    return [
        target(
            f"{model}: bmoe >= LRU and >= the in-budget partition at every budget",
            f"{len(passed)} of {len(rows)}" + (f" (short at {', '.join(failed)} MiB)" if failed else ""),
            "every budget",
            not failed,
        )
    ]
