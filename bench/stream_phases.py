"""How much of a decode token's compute can split-phase reads hide, on a given model?

Split-phase reads (docs/streaming.md) overlap a layer's ``down`` reads with the compute between
its routing node and the node before its ``down`` matmul (the gate and up matmuls, the SwiGLU).
This script runs the model resident and warm through llama.cpp's C API, stops the graph at the
same nodes the streaming hook stops at (``ffn_moe_topk-<il>``, ``ffn_moe_swiglu-<il>``) and
times, per decoded token, that span against the whole token. With reads R and compute C per
token, synchronous streaming takes R + C; split phase takes R + C - H, where H (the hideable
span) is at most the time the down reads take.

    .venv/bin/python bench/stream_phases.py [--model bench/out/synthetic-qwen3moe-16L-q4_0.gguf]

It loads the whole file (mmap) and drops it from the page cache at the end.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import record
from stream_child import PROMPT, PlainLlama

ROUTE, STOP = b"ffn_moe_topk-", b"ffn_moe_swiglu-"


class Timer:
    """cb_eval stopping at the routing node and the node before down, noting when each is done."""

    def __init__(self) -> None:
        import llama_cpp

        from bmoe.llama.ggml_tensor import NAME_OFFSET

        self._name_at = NAME_OFFSET
        self.marks: list[tuple[bytes, float]] = []
        self.c_callback = llama_cpp.ggml_backend_sched_eval_callback(self._cb)

    def _cb(self, t: int | None, ask: bool, _user: object) -> bool:
        if not t:
            return False
        name = ctypes.string_at(t + self._name_at, 16)
        if not name.startswith((ROUTE, STOP)):
            return False
        if not ask:
            self.marks.append((name[: len(ROUTE)] if name.startswith(ROUTE) else STOP, time.perf_counter()))
        return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=HERE / "out" / "synthetic-qwen3moe-16L-q4_0.gguf")
    ap.add_argument("--n-predict", type=int, default=32, help="decoded tokens measured (after 4 warm-up decodes)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="JSON results (default: next to the model)")
    record.add_args(ap)
    a = ap.parse_args(argv)

    timer = Timer()
    plain = PlainLlama(a.model, extra_bufts=False, n_threads=a.threads, n_ctx=512, cb_eval=timer.c_callback)

    prompt = plain.tokenize(PROMPT)
    tok, pos = plain._decode(prompt, 0), len(prompt)
    walls, hidden = [], []
    for i in range(a.n_predict + 4):
        timer.marks.clear()
        t0 = time.perf_counter()
        tok = plain._decode([tok], pos)
        wall = time.perf_counter() - t0
        pos += 1
        if i < 4:
            continue
        h = sum(t2 - t1 for (n1, t1), (n2, t2) in zip(timer.marks, timer.marks[1:]) if n1 == ROUTE and n2 == STOP)
        walls.append(wall)
        hidden.append(h)
    plain.close()
    fd = os.open(a.model, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)

    report = {
        "model": str(a.model),
        "threads": a.threads,
        "decoded_tokens": len(walls),
        "loadavg": [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]],
        "token_ms_median": statistics.median(walls) * 1e3,
        "hideable_ms_median": statistics.median(hidden) * 1e3,
        "hideable_share_median": statistics.median(h / w for h, w in zip(hidden, walls)),
        "token_ms": [round(w * 1e3, 2) for w in walls],
        "hideable_ms": [round(h * 1e3, 2) for h in hidden],
    }
    out = a.out or a.model.with_suffix(".phases.json")
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if not k.endswith("_ms")}, indent=1))
    print(f"results: {out}")
    rec = record.record(
        "stream_phases",
        command=record.invocation("stream_phases.py", argv),
        config={"model": str(a.model), "threads": a.threads, "n_predict": a.n_predict},
        tables=[
            record.figures(
                "Resident decode: the share of a token between a layer's route and its down matmul",
                {k: v for k, v in report.items() if k not in ("model", "threads")}
                | {"token_ms_min": min(walls) * 1e3, "token_ms_max": max(walls) * 1e3},
            )
        ],
        machine_facts=record.machine(model=a.model),
    )
    record.write(rec, a.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
