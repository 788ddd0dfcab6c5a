"""Benchmark (issue #30): an image's encoding by the vision projector against the language model's
prefill of its tokens, resident and streamed, on the tiny qwen3vlmoe and its projector.

Each round opens a session (``--mmproj``, decide on), asks one decision over a fresh image of each
size (its own seed, so nothing is remembered from an earlier encoding), and times, per image, the
projector's ``encode`` (the vision encoder) and the language model's prefill of the image's
embeddings (the streaming hook sees those graphs like any other), from wrappers around the
session's projector. Medians over the rounds; the encoder runs resident in every mode.

    .venv/bin/python bench/images.py [--rounds 5] [--sizes 128x96 256x192 448x336]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODES = {
    "resident": {},
    "streamed, cache off": {"moe_stream": True, "cache_mb": 0},
    "streamed, cache 1 MiB": {"moe_stream": True, "cache_mb": 1, "cache_force": True},
}


def measure(model: Path, mmproj: Path, images: list[tuple[str, Path]], mode: dict, threads: int) -> dict[str, dict]:
    from bmoe.config import SessionConfig
    from bmoe.decide.types import DecideRequest
    from bmoe.session import Session

    out: dict[str, dict] = {}
    with Session(SessionConfig(model=model, mmproj=mmproj, chat="chatml", decide=True, n_ctx=2048, n_threads=threads,
                               plan="off", **mode)) as s:
        projector = s.runtime.images.projector
        enc, pre = projector.encode, projector.prefill
        times: dict[str, float] = {}

        def encode(image):
            t0 = time.perf_counter()
            try:
                return enc(image)
            finally:
                times["encode_s"] = time.perf_counter() - t0

        def prefill(ctx, image, embd, pos0, seq=0):
            t0 = time.perf_counter()
            try:
                return pre(ctx, image, embd, pos0, seq)
            finally:
                times["prefill_s"] = time.perf_counter() - t0
                times["n_tokens"] = len(embd)

        projector.encode, projector.prefill = encode, prefill
        for i, (size, path) in enumerate(images):
            times.clear()
            r = s.decide(DecideRequest(id=i, prefix="Look at the screen.", suffix=" Which button? A, B or C.",
                                       choices=("A", "B", "C"), images=(str(path),), reuse_prefix=False))
            if r.error is not None:
                raise RuntimeError(r.error)
            out[size] = dict(times)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", nargs="+", default=["128x96", "256x192", "448x336"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bmoe-bench-images")
    a = ap.parse_args(argv)
    from bmoe.testing import write_hf_arch, write_hf_mmproj, write_png

    a.work.mkdir(parents=True, exist_ok=True)
    model, mmproj = write_hf_arch("qwen3vlmoe", "q8_0", a.work), write_hf_mmproj("qwen3vlmoe", a.work)
    rows: dict[tuple[str, str], list[dict]] = {}
    for rnd in range(a.rounds):
        for name, mode in MODES.items():  # in turn, so a burst of load hits every mode alike
            images = []
            for size in a.sizes:
                w, h = (int(x) for x in size.split("x"))
                images.append((size, write_png(a.work / f"{size}-{rnd}.png", w, h, seed=100 + rnd)))
            for size, t in measure(model, mmproj, images, mode, a.threads).items():
                rows.setdefault((name, size), []).append(t)
    print(f"tiny qwen3vlmoe (Q8_0) + its F32 projector, {a.threads} threads, median of {a.rounds} rounds (min..max)\n")
    print("| mode | image | image tokens | encode ms | LM prefill of the image ms | encode / prefill |")
    print("|---|---|---|---|---|---|")
    for (name, size), ts in rows.items():
        enc = [t["encode_s"] * 1e3 for t in ts]
        pre = [t["prefill_s"] * 1e3 for t in ts]
        print(f"| {name} | {size} | {ts[0]['n_tokens']} | {statistics.median(enc):.1f} ({min(enc):.1f}..{max(enc):.1f}) "
              f"| {statistics.median(pre):.1f} ({min(pre):.1f}..{max(pre):.1f}) "
              f"| {statistics.median(enc) / statistics.median(pre):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
