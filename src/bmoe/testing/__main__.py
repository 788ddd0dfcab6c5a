"""``python -m bmoe.testing``: write tiny fixture GGUFs for benchmarks and users."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bmoe.testing.recipes import ARCHS
from bmoe.testing.spec import ALL_QUANTS, QUANTS
from bmoe.testing.writer import default_tiny_dir, write_tiny


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bmoe.testing",
        description="Write deterministic tiny random-weight MoE GGUFs (reused when already current).",
    )
    ap.add_argument("--arch", choices=ARCHS, help="architecture to write")
    ap.add_argument("--quant", choices=ALL_QUANTS, default="f32", help="variant (default: f32)")
    ap.add_argument("--all", action="store_true", help=f"write every arch in {', '.join(QUANTS)}")
    ap.add_argument(
        "--out", type=Path, default=None, help="output folder (default: $BMOE_TINY_DIR or ~/.cache/bmoe/tiny)"
    )
    args = ap.parse_args(argv)
    if args.all == (args.arch is not None):
        ap.error("give either --arch (with --quant) or --all")
    out = args.out if args.out is not None else default_tiny_dir()
    jobs = [(a, q) for a in ARCHS for q in QUANTS] if args.all else [(args.arch, args.quant)]
    for arch, quant in jobs:
        path = write_tiny(arch, quant, out)
        print(f"{path}\t{path.stat().st_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
