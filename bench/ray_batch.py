"""Benchmark: decisions over a data set on SmolLM2-135M-Instruct, one session in this process
against a Ray actor pool of 1 and of 2 actors (bmoe.ray.data), on a Ray instance started here.

The data: 6 agent prefixes x N suffixes (default 24: 144 decisions), shuffled; every row is a
protocol decide line, as bmoe-batch reads them. Each actor reserves 1 CPU and runs llama.cpp on one
thread; the in-process session uses one thread too. Reported per configuration: wall seconds of
the whole run (for Ray: from submitting the data set to the last result, so it includes starting
the actors and loading the model in each), rows per second, and whether the answers equal the
in-process ones (choice_logp, bit for bit). Each configuration runs --reps times; the table shows
the median. The machine's cores cap what 2 actors can gain: name them in the write-up.

    .venv/bin/python bench/ray_batch.py [--per-task 24] [--decide-batch 8] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

TASKS = [
    "You control a phone. Task: turn on Wi-Fi. History:",
    "Agent for a shop: find the cheapest kettle. Steps so far:",
    "Robot in a kitchen, goal: boil water. Done:",
    "Mail assistant. Goal: archive old newsletters. Log:",
    "Calendar helper; aim: book a dentist. Progress:",
    "Browser agent, objective: download the invoice. Trace:",
]


def rows(per_task: int) -> list[str]:
    out = [
        json.dumps(
            {
                "id": t * 1000 + k,
                "prefix": task,
                "suffix": f" step {k}. Screen {k}. Options: A) back B) next C) stop. Answer with the letter.",
                "choices": ["A", "B", "C"],
            }
        )
        for t, task in enumerate(TASKS)
        for k in range(per_task)
    ]
    random.Random(0).shuffle(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-task", type=int, default=24)
    ap.add_argument("--decide-batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    import record

    record.add_args(ap)
    args = ap.parse_args()

    import ray.data

    import ray
    from bmoe.config import SessionConfig
    from bmoe.ray.data import RayOptions, RayRun, answer_local
    from bmoe.testing import smollm2_gguf_path

    cfg = SessionConfig(
        model=smollm2_gguf_path(), chat="chatml", decide=True, decide_batch=args.decide_batch, n_ctx=1024, n_threads=1
    )
    data = rows(args.per_task)
    print(
        f"{len(data)} decisions, decide_batch {args.decide_batch}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    timings: dict[str, list[float]] = {}
    reference = None
    same: dict[str, bool] = {}
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    for _ in range(args.reps):
        for name in ("in-process", "ray 1 actor", "ray 2 actors"):
            start = time.perf_counter()
            if name == "in-process":
                got = answer_local(data, cfg)
            else:
                got = RayRun(data, cfg, RayOptions(actors=1 if "1" in name else 2, batch_rows=24)).results()
            timings.setdefault(name, []).append(time.perf_counter() - start)
            logp = [r.get("choice_logp") for r in got]
            reference = reference or logp
            same[name] = same.get(name, True) and logp == reference
    ray.shutdown()
    print("| configuration | wall s (median) | decisions/s | answers equal in-process |")
    print("|---|---|---|---|")
    for name, ts in timings.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.1f} ({', '.join(f'{t:.1f}' for t in ts)}) | {len(data) / med:.2f} | {same[name]} |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    rec_rows = [
        {
            "name": name,
            "wall_s": statistics.median(ts),
            "rounds_s": ts,
            "decisions_s": len(data) / statistics.median(ts),
            "equal": same[name],
        }
        for name, ts in timings.items()
    ]
    cols = (
        ("name", "configuration", ""),
        ("wall_s", "wall s (median)", ".1f"),
        ("decisions_s", "decisions/s", ".2f"),
        ("equal", "answers equal the in-process run", ""),
    )
    rec = record.record(
        "ray_batch",
        command=record.invocation("ray_batch.py"),
        config={k: v for k, v in vars(args).items() if k != "results"} | {"decisions": len(data)},
        tables=[
            record.table(
                "SmolLM2 decisions through Ray against one session in process",
                cols,
                rec_rows,
                {"row": "in-process", "key": "wall_s", "label": "wall / in-process"},
            )
        ],
        targets=[
            record.target(f"{r['name']}: answers equal in-process", None, "bit for bit", r["equal"]) for r in rec_rows
        ],
    )
    record.write(rec, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
