"""Benchmark (issue #30): an image's encoding by the vision projector against the language model's
prefill of its tokens, resident and streamed, on the tiny qwen3vlmoe and its projector, or
(``--bench-model``) on the bench model's shapes: the synthetic Qwen3-30B-A3B-shaped qwen3moe
(bench/synthetic_moe.py) with a synthetic projector of Qwen3-VL-30B-A3B's vision tower
(bench/synthetic_mmproj.py).

Each round opens a session (``--mmproj``, decide on), asks one decision over a fresh image of each
size (its own seed, so nothing is remembered from an earlier encoding), and times, per image, the
projector's ``encode`` (the vision encoder) and the language model's prefill of the image's
embeddings (the streaming hook sees those graphs like any other), from wrappers around the
session's projector. Medians over the rounds; the encoder runs resident in every mode.

With ``--bench-model`` the streamed modes are bench/decide_stream.py's read-ahead configurations
(``--io-threads`` read lanes, read-ahead on with its rule, the dense twin under ``<work>/twins``,
ubatches of 512): cache off, and a cache of ``--cache-pct`` percent of the expert bytes. No memory
limit. ``--spec-layers`` and ``--vision-depth`` cut the two models for smoke runs.

    .venv/bin/python bench/images.py [--rounds 5] [--sizes 128x96 256x192 448x336]
    .venv/bin/python bench/images.py --bench-model [--work bench/out] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import record  # noqa: E402

MODES = {
    "resident": {},
    "streamed, cache off": {"moe_stream": True, "cache_mb": 0},
    "streamed, cache 1 MiB": {"moe_stream": True, "cache_mb": 1, "cache_force": True},
}
BENCH_SIZES = ["256x256", "512x512", "1024x1024"]  # 64, 256 and 1024 image tokens (32 x 32 pixels each)
BENCH_UBATCH = 512  # bench/decide_stream_child.py's --ubatch


def bench_modes(expert_bytes: int, cache_pct: int, io_threads: int, twins: Path) -> dict[str, dict]:
    """The bench model's configurations: resident, and decide_stream.py's streamed ones with
    read-ahead (cache off, and a cache of ``cache_pct`` percent of the expert bytes)."""
    from decide_stream import cache_mib

    common = {"n_batch": BENCH_UBATCH, "n_ubatch": BENCH_UBATCH}
    stream = {
        **common,
        "moe_stream": True,
        "io_threads": io_threads,
        "prefetch": True,
        "prefetch_wide_tokens": 0,
        "twin_dir": twins,
    }
    return {
        "resident": common,
        "streamed, cache off, read-ahead": {**stream, "cache_mb": 0},
        f"streamed, cache {cache_pct}%, read-ahead": {**stream, "cache_mb": cache_mib(expert_bytes, cache_pct)},
    }


def measure(
    model: Path, mmproj: Path, images: list[tuple[str, Path]], mode: dict, threads: int, n_ctx: int = 2048
) -> dict[str, dict]:
    from bmoe.config import SessionConfig
    from bmoe.decide.types import DecideRequest
    from bmoe.session import Session

    out: dict[str, dict] = {}
    with Session(
        SessionConfig(
            model=model, mmproj=mmproj, chat="chatml", decide=True, n_ctx=n_ctx, n_threads=threads, plan="off", **mode
        )
    ) as s:
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
            r = s.decide(
                DecideRequest(
                    id=i,
                    prefix="Look at the screen.",
                    suffix=" Which button? A, B or C.",
                    choices=("A", "B", "C"),
                    images=(str(path),),
                    reuse_prefix=False,
                )
            )
            if r.error is not None:
                raise RuntimeError(r.error)
            out[size] = dict(times)
    return out


def bench_models(work: Path, spec_layers: int | None, vision_depth: int | None) -> tuple[Path, Path, str]:
    """The synthetic LM (``spec_layers``: the uniform preset cut to that many layers, as
    decide_stream.py's smoke runs) and the synthetic projector of its width, with a label."""
    import synthetic_mmproj as smp
    from decide_stream import model_for
    from synthetic_moe import PRESETS

    lm_spec = PRESETS["uniform"]
    model = model_for(work, "uniform", spec_layers)
    vspec = smp.VisionSpec(out_dim=lm_spec.n_embd)
    if vision_depth:
        vspec = dataclasses.replace(vspec, depth=vision_depth)
    mmproj = smp.write_mmproj(work, vspec)
    label = (
        f"synthetic qwen3moe ({spec_layers or lm_spec.n_layer} layers, Q4_0) + synthetic qwen3vl projector "
        f"({vspec.depth} blocks of {vspec.n_embd}, F16, no DeepStack)"
    )
    return model, mmproj, label


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--sizes",
        nargs="+",
        default=None,
        help=f"image sizes WxH (default 128x96 256x192 448x336; --bench-model: {' '.join(BENCH_SIZES)})",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--work",
        type=Path,
        default=None,
        help="models and images (default: a temporary folder; --bench-model: bench/out)",
    )
    ap.add_argument(
        "--bench-model",
        action="store_true",
        help="the synthetic Qwen3-30B-A3B-shaped model with a synthetic Qwen3-VL-30B-A3B projector",
    )
    ap.add_argument("--spec-layers", type=int, default=None, help="--bench-model smoke runs: the LM with N layers")
    ap.add_argument(
        "--vision-depth", type=int, default=None, help="--bench-model smoke runs: the projector with N blocks (27)"
    )
    ap.add_argument(
        "--cache-pct",
        type=int,
        default=30,
        help="--bench-model: the streamed cache's share of the expert bytes, percent",
    )
    ap.add_argument("--io-threads", type=int, default=8, help="--bench-model: read lanes of the streamed modes")
    record.add_args(ap)
    a = ap.parse_args(argv)
    sizes = a.sizes or (BENCH_SIZES if a.bench_model else ["128x96", "256x192", "448x336"])
    work = (a.work or (HERE / "out" if a.bench_model else Path(tempfile.gettempdir()) / "bmoe-bench-images")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    from bmoe.testing import write_png

    if a.bench_model:
        from stream import make_twin

        model, mmproj, label = bench_models(work, a.spec_layers, a.vision_depth)
        info = make_twin(model, work / "twins")
        modes = bench_modes(int(info["expert_mib"] * 2**20), a.cache_pct, a.io_threads, work / "twins")
        print(f"{model} ({info['file_mib']:.0f} MiB, experts {info['expert_mib']:.0f} MiB)\n{mmproj}", flush=True)
    else:
        from bmoe.testing import write_hf_arch, write_hf_mmproj

        model, mmproj = write_hf_arch("qwen3vlmoe", "q8_0", work), write_hf_mmproj("qwen3vlmoe", work)
        label, modes = "tiny qwen3vlmoe (Q8_0) + its F32 projector", MODES
    dims = [tuple(int(x) for x in size.split("x")) for size in sizes]
    n_ctx = max(
        2048, max(w * h for w, h in dims) // 1024 + 512
    )  # the largest image's tokens (32 x 32 pixels each), text
    rows: dict[tuple[str, str], list[dict]] = {}
    for rnd in range(a.rounds):
        for name, mode in modes.items():  # in turn, so a burst of load hits every mode alike
            images = [
                (size, write_png(work / f"image-{size}-{rnd}.png", w, h, seed=100 + rnd))
                for size, (w, h) in zip(sizes, dims)
            ]
            t0 = time.perf_counter()
            for size, t in measure(model, mmproj, images, mode, a.threads, n_ctx).items():
                rows.setdefault((name, size), []).append(t)
            print(f"# round {rnd + 1}/{a.rounds}, {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"\n{label}, {a.threads} threads, median of {a.rounds} rounds (min..max)\n")
    print("| mode | image | image tokens | encode ms | LM prefill of the image ms | encode / prefill |")
    print("|---|---|---|---|---|---|")
    rec_rows = []
    for (name, size), ts in rows.items():
        enc = [t["encode_s"] * 1e3 for t in ts]
        pre = [t["prefill_s"] * 1e3 for t in ts]
        rec_rows.append(
            {
                "name": f"{name}, {size}",
                "image_tokens": ts[0]["n_tokens"],
                "encode_ms": statistics.median(enc),
                "prefill_ms": statistics.median(pre),
                "encode_over_prefill": statistics.median(enc) / statistics.median(pre),
            }
        )
        print(
            f"| {name} | {size} | {ts[0]['n_tokens']} | {statistics.median(enc):.1f} ({min(enc):.1f}..{max(enc):.1f}) "
            f"| {statistics.median(pre):.1f} ({min(pre):.1f}..{max(pre):.1f}) "
            f"| {statistics.median(enc) / statistics.median(pre):.2f} |"
        )
    if a.bench_model:
        out = work / "images-bench.json"
        out.write_text(
            json.dumps(
                {
                    "command": record.invocation("images.py", argv),
                    "model": str(model),
                    "mmproj": str(mmproj),
                    "label": label,
                    "threads": a.threads,
                    "modes": {k: {f: str(v) for f, v in m.items()} for k, m in modes.items()},
                    "rows": [{"mode": n, "image": s, "rounds": ts} for (n, s), ts in rows.items()],
                },
                indent=1,
            )
        )
        print(f"\nresults: {out}")
    cols = (
        ("name", "mode, image", ""),
        ("image_tokens", "image tokens", "d"),
        ("encode_ms", "encode ms", ".0f" if a.bench_model else ".1f"),
        ("prefill_ms", "LM prefill ms", ".0f" if a.bench_model else ".1f"),
        ("encode_over_prefill", "encode / prefill", ".2f"),
    )
    rec = record.record(
        "images" if a.bench_model else "images_tiny",
        command=record.invocation("images.py", argv),
        config={k: v for k, v in vars(a).items() if k != "results"} | {"model": label},
        tables=[
            record.table(f"Encoding against the prefill of the image (median of {a.rounds} rounds, ms)", cols, rec_rows)
        ],
        partial=a.spec_layers is not None or a.vision_depth is not None,
        machine_facts=record.machine(model=model if a.bench_model else None, disk=work),
    )
    record.write(rec, a.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
