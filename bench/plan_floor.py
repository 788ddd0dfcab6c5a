"""The plan's floor (issue #38.11): a one-shot answer of the bench model, planned (no flags), in a
fresh cgroup-v1 memory cgroup per limit with the page cache dropped: the plan it chose
(--plan-only under the same limit), whether the answer ran or was OOM-killed or refused, the
cgroup's peak charge and decode tok/s (indicative only on a shared machine).

    .venv/bin/python bench/plan_floor.py [--limits 0.75 1 1.25 1.5] [--model PATH] [-- extra bmoe-cli flags]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import record  # noqa: E402
from cgroup_run import run_limited  # noqa: E402

PROMPT = " ".join(["the sea"] * 16)  # 32 words: about 32 tokens
DEFAULT_MODEL = Path.home() / ".cache/bmoe/bench/synthetic-qwen3moe-16L-q4_0.gguf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limits", nargs="+", type=float, default=[0.75, 1, 1.25, 1.5])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("extra", nargs="*")
    record.add_args(ap)
    a = ap.parse_args()
    rec_rows = []
    base = [sys.executable, "-m", "bmoe.cli", "-m", str(a.model), *a.extra]
    print("| limit MiB | plan | outcome | peak MiB | tok/s |")
    print("|---|---|---|---|---|")
    for gib in a.limits:
        limit = int(gib * 1024) << 20
        shown = run_limited([*base, "--plan-only"], limit, timeout_s=300, tag="plan")
        head = next((ln for ln in shown.stderr_tail.splitlines() if ln.startswith(("plan:", "bmoe-cli:"))), "")
        rows = {
            m.group(1): m.group(2) for m in re.finditer(r"^\s+(\w+)\s+(\S+)\s+(?:plan|you)", shown.stderr_tail, re.M)
        }
        plan = (
            (
                f"{head.split()[1]} cache {rows.get('cache_mb', '-')} prefetch {rows.get('prefetch', '-')} "
                f"dense {rows.get('dense_weights', '-')} ub {rows.get('n_ubatch', '-')}"
            )
            if head.startswith("plan:")
            else head
        )
        out = run_limited([*base, "-p", PROMPT, "-n", str(a.n)], limit, timeout_s=600, tag="run")
        tps = re.findall(r"\(([0-9.]+) tok/s\)", out.stderr_tail)
        outcome = (
            "OOM-killed"
            if out.oom_killed
            else "ran"
            if out.returncode == 0
            else f"rc {out.returncode}: {out.stderr_tail.strip().splitlines()[-1] if out.stderr_tail.strip() else ''}"
        )
        print(
            f"| {gib * 1024:.0f} | {plan} | {outcome} | {out.max_usage_mib:.0f} | {tps[-1] if tps else '-'} |",
            flush=True,
        )
        rec_rows.append(
            {
                "name": f"{gib * 1024:.0f} MiB",
                "plan": plan,
                "outcome": outcome,
                "peak_mib": out.max_usage_mib,
                "tok_s": float(tps[-1]) if tps else None,
                "oom_killed": bool(out.oom_killed),
            }
        )
    cols = (
        ("name", "limit", ""),
        ("plan", "plan", ""),
        ("outcome", "outcome", ""),
        ("peak_mib", "cgroup peak MiB", ".0f"),
        ("tok_s", "tok/s (indicative)", ".2f"),
    )
    rec = record.record(
        "plan_floor",
        command=record.invocation("plan_floor.py"),
        config={"limits_gib": a.limits, "n": a.n, "model": str(a.model), "extra": a.extra},
        tables=[record.table("The plan under small memory limits", cols, rec_rows)],
        targets=[
            record.target(f"{r['name']}: not OOM-killed", None, "ran or refused", not r["oom_killed"]) for r in rec_rows
        ],
        machine_facts=record.machine(model=a.model if a.model.exists() else None),
    )
    record.write(rec, a.results)


if __name__ == "__main__":
    main()
