"""Benchmark: what keeping K-quant batches exact costs (issue 38, docs/decide.md "What is exact").

On K-quant weights a batch's llama_decode calls are bounded (bmoe.runtime.forks.RowLimits) so that
no matmul crosses the 8-row bound of llama.cpp's tiled K-quant kernel. This times, in one process
and in alternating rounds, 16 decisions sharing a kept prefix (bench/decide_batch.py's agent
prompts) three ways:
    one by one    Session.decide, sixteen times
    exact batch   Session.decide_many with --decide-batch 16 (the calls bounded: today's code)
    wide batch    the same with the bound lifted: every suffix of a length class in one call, as
                  before issue 38 (the log-probs a little off one by one)
and reports decisions/s (median of the rounds, and the spread max-min over median), and how far the
wide batch's log-probs are from one by one. Models: SmolLM2-135M-Instruct requantized to Q4_K_M
(bmoe.llama.quantize; dense: its ffn_down is Q4_K), and the tiny qwen3moe in Q4_K_M, resident and
streamed with the cache off.

    .venv/bin/python bench/decide_kquant.py [--work bench/out] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import record  # noqa: E402
from decide_batch import CHOICES, PREFIX, suffixes  # noqa: E402

from bmoe.config import SessionConfig  # noqa: E402
from bmoe.decide.types import DecideRequest  # noqa: E402
from bmoe.runtime import decide as runtime_decide  # noqa: E402
from bmoe.runtime.forks import NO_LIMITS  # noqa: E402
from bmoe.session import Session  # noqa: E402


def requests() -> list[DecideRequest]:
    return [DecideRequest(id=i + 1, prefix=PREFIX, suffix=s, choices=CHOICES) for i, s in enumerate(suffixes())]


def models(work: Path) -> list[tuple[str, Path, dict]]:
    from bmoe.llama.quantize import quantize_gguf
    from bmoe.testing import smollm2_gguf_path, write_tiny

    work.mkdir(parents=True, exist_ok=True)
    smol = work / "smollm2-135m-q4_k_m.gguf"
    if not smol.exists():
        quantize_gguf(smollm2_gguf_path(), smol, "Q4_K_M", allow_requantize=True)
    tiny = write_tiny("qwen3moe", "q4_k_m", Path(os.environ.get("BMOE_TINY_DIR", work / "tiny")))
    return [
        ("SmolLM2-135M Q4_K_M", smol, {}),
        ("tiny qwen3moe Q4_K_M", tiny, {}),
        ("tiny qwen3moe Q4_K_M streamed", tiny, {"moe_stream": True, "cache_mb": 0, "twin_dir": work / "twins"}),
    ]


def run(model: Path, kw: dict, how: str, threads: int) -> tuple[float, list, float]:
    cfg = SessionConfig(model=model, n_ctx=1024, n_threads=threads, decide=True, decide_batch=16, **kw)
    s = Session(cfg)
    try:
        if how == "wide":
            s.decider.decider.seq._limits = NO_LIMITS  # the bound lifted, as before issue 38
        reqs = requests()
        s.decide(DecideRequest(id=0, prefix=PREFIX, suffix=" Screen: Home.", choices=CHOICES))  # keep the prefix
        read0 = s.stream_stats().read_bytes if kw.get("moe_stream") else 0
        t = time.perf_counter()
        out = [s.decide(r) for r in reqs] if how == "one by one" else s.decide_many(reqs)
        dt = time.perf_counter() - t
        read = (s.stream_stats().read_bytes - read0) / 1e6 if kw.get("moe_stream") else 0.0
        return dt, [r.scores.choice_logp for r in out], read
    finally:
        s.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=HERE / "out" / "kquant")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="", help="run only the models whose name contains this")
    record.add_args(ap)
    a = ap.parse_args()
    rec_rows = []
    assert runtime_decide  # the adapter whose bound the wide run lifts
    print(
        "| model | one by one dec/s | exact batch dec/s | wide batch dec/s | spread (max-min)/median | "
        "expert MB read (one by one / exact / wide) | wide max abs d logp | exact == one by one |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, path, kw in models(a.work):
        if a.only not in name:
            continue
        secs: dict[str, list[float]] = {"one by one": [], "exact": [], "wide": []}
        logps: dict[str, list] = {}
        reads: dict[str, float] = {}
        for _ in range(a.rounds):
            for how in secs:
                dt, lp, reads[how] = run(path, kw, how, a.threads)
                secs[how].append(dt)
                logps[how] = lp
        rate = {h: len(requests()) / statistics.median(v) for h, v in secs.items()}
        spread = max((max(v) - min(v)) / statistics.median(v) for v in secs.values())
        wide = max(float(np.max(np.abs(np.subtract(w, o)))) for w, o in zip(logps["wide"], logps["one by one"]))
        same = logps["exact"] == logps["one by one"]
        mb = " / ".join(f"{reads[h]:.1f}" for h in secs) if kw.get("moe_stream") else "-"
        print(
            f"| {name} | {rate['one by one']:.1f} | {rate['exact']:.1f} | {rate['wide']:.1f} | {spread:.0%} | {mb} | "
            f"{wide:.2g} | {same} |"
        )
        rec_rows.append(
            {
                "name": name,
                "one_by_one_dec_s": rate["one by one"],
                "exact_dec_s": rate["exact"],
                "wide_dec_s": rate["wide"],
                "spread": spread,
                "read_mb": [reads[h] for h in secs] if kw.get("moe_stream") else None,
                "wide_max_dlogp": wide,
                "exact_equals_one_by_one": same,
            }
        )
    cols = (
        ("name", "model", ""),
        ("one_by_one_dec_s", "one by one dec/s", ".1f"),
        ("exact_dec_s", "exact batch dec/s", ".1f"),
        ("wide_dec_s", "wide batch dec/s", ".1f"),
        ("spread", "spread", ".0%"),
        ("read_mb", "expert MB read (one by one / exact / wide)", ".1f"),
        ("wide_max_dlogp", "wide: max abs d logp", ".2g"),
        ("exact_equals_one_by_one", "exact == one by one", ""),
    )
    rec = record.record(
        "decide_kquant",
        command=record.invocation("decide_kquant.py"),
        config={"rounds": a.rounds, "threads": a.threads, "only": a.only},
        tables=[record.table("16 decisions: one by one, the exact batch and the wide batch", cols, rec_rows)],
        targets=[
            record.target(
                f"{r['name']}: the exact batch equals one by one", None, "bit for bit", r["exact_equals_one_by_one"]
            )
            for r in rec_rows
        ],
        partial=bool(a.only),
        machine_facts=record.machine(disk=a.work),
    )
    record.write(rec, a.results)


if __name__ == "__main__":
    main()
