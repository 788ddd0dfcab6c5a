"""What the sampled content check of a streamed session costs (docs/streaming.md, "The content check").

First the check alone: blocks sampled, time of one check with the blocks in the page cache (warm)
and after dropping the file from it (cold). Then decode in one streamed session (cache off), in
alternating rounds: the check off, on its default schedule, and forced at every ubatch (the worst
case), with the decode time per token and the checks each round made.

    .venv/bin/python bench/content_check.py [--model bench/out/synthetic-qwen3moe-16L-q4_0.gguf]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import record  # noqa: E402


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def check_alone(model: Path, repeats: int) -> dict[str, float]:
    from bmoe.stream import read_layout
    from bmoe.stream.content import ContentSample

    layout = read_layout(model)
    sample = ContentSample.take(layout)
    paths = [f.path for f in layout.files]
    warm, cold = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sample.changed(paths)
        warm.append(time.perf_counter() - t0)
    for _ in range(max(3, repeats // 10)):
        for p in paths:
            evict(p)
        t0 = time.perf_counter()
        sample.changed(paths)
        cold.append(time.perf_counter() - t0)
    return {
        "expert_tensors": len(layout.experts),
        "blocks": sample.n_blocks,
        "sampled_kib": sum(n for b in sample.blocks for _, n in b) / 1024,
        "warm_ms": statistics.median(warm) * 1e3,
        "cold_ms": statistics.median(cold) * 1e3,
    }


def decode_rounds(a: argparse.Namespace) -> dict[str, dict[str, float]]:
    import math

    from bmoe.config import SessionConfig
    from bmoe.runtime.results import GenerateRequest
    from bmoe.session import Session
    from bmoe.stream import reader as reader_mod

    cfg = SessionConfig(
        model=a.model,
        n_ctx=512,
        n_threads=a.threads,
        chat="none",
        moe_stream=True,
        io_threads=a.io_threads,
        twin_dir=a.twins,
    )
    defaults = (reader_mod.CHECK_EVERY_S, reader_mod.COST_SHARE)
    out: dict[str, list[tuple[float, int, float]]] = {"off": [], "default": [], "every ubatch": []}
    with Session(cfg) as s:
        r = s.streaming.streamer.reader
        sample = r._content
        s.generate(GenerateRequest(prompt="Warm up.", n_predict=4, clear_kv=True))
        for _ in range(a.rounds):
            for mode in out:
                r._content = None if mode == "off" else sample
                reader_mod.CHECK_EVERY_S, reader_mod.COST_SHARE = (
                    (0.0, math.inf) if mode == "every ubatch" else defaults
                )
                n0, c0 = r.content_checks, r.content_s
                res = s.generate(GenerateRequest(prompt="Tell me about the sea.", n_predict=a.tokens, clear_kv=True))
                out[mode].append((res.decode_s / max(1, res.n_tokens - 1), r.content_checks - n0, r.content_s - c0))
        reader_mod.CHECK_EVERY_S, reader_mod.COST_SHARE = defaults
    return {
        mode: {
            "ms_per_token_median": statistics.median(x[0] for x in rows) * 1e3,
            "ms_per_token_all": [round(x[0] * 1e3, 1) for x in rows],
            "checks_per_round": statistics.mean(x[1] for x in rows),
            "check_ms_per_round": statistics.mean(x[2] for x in rows) * 1e3,
        }
        for mode, rows in out.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=HERE / "out" / "synthetic-qwen3moe-16L-q4_0.gguf")
    ap.add_argument("--twins", type=Path, default=HERE / "out" / "twins")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--io-threads", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=50)
    record.add_args(ap)
    a = ap.parse_args()
    report = {"model": str(a.model), "check": check_alone(a.model, a.repeats), "decode": decode_rounds(a)}
    print(json.dumps(report, indent=1))
    rec = record.record(
        "content_check",
        command=record.invocation("content_check.py"),
        config={k: v for k, v in vars(a).items() if k != "results"},
        tables=[
            record.figures("One check of the sampled blocks, alone (median ms)", report["check"]),
            record.table(
                f"Streamed decode, cache off: the check off, on its schedule, every ubatch ({a.rounds} rounds in turn)",
                (
                    ("name", "check", ""),
                    ("ms_per_token_median", "ms/token (median)", ".1f"),
                    ("ms_per_token_all", "each round", ".1f"),
                    ("checks_per_round", "checks/round", ".1f"),
                    ("check_ms_per_round", "check ms/round", ".2f"),
                ),
                [{"name": k, **v} for k, v in report["decode"].items()],
                {"row": "off", "key": "ms_per_token_median", "label": "ms/token / the check off's"},
            ),
        ],
        machine_facts=record.machine(model=a.model),
    )
    record.write(rec, a.results)


if __name__ == "__main__":
    main()
