"""What the commands that run rows on Ray (bmoe-batch, bmoe-eval) share: the flags sizing an
actor, and a failed Ray run said in one line."""

from __future__ import annotations

import argparse

from bmoe.flags import int_at_least


def _cpus(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        x = 0.0
    if not x > 0 or x != x or x == float("inf"):
        raise argparse.ArgumentTypeError(f"takes a number > 0, got {v!r}")
    return x


def add_actor_flags(group: argparse._ArgumentGroup) -> None:
    """--actor-cpus and --actor-memory-mb (RayOptions.num_cpus and memory_mb)."""
    group.add_argument(
        "--actor-cpus",
        type=_cpus,
        default=1.0,
        metavar="X",
        help="CPUs each actor reserves; also its llama.cpp threads unless --threads is given (default 1)",
    )
    group.add_argument(
        "--actor-memory-mb",
        type=int_at_least(1),
        default=None,
        metavar="N",
        help="memory each actor reserves, in MiB (default: weights + KV + overhead, docs/scale-out.md)",
    )


def run_failure(e: Exception) -> str:
    """One line for an exception out of a run on Ray that is not a BmoeError: the ray extra
    missing, or Ray's own failure (cluster unreachable, every retry spent; its first line)."""
    if isinstance(e, ImportError):
        return f"--ray needs the ray extra ({e.name} is missing): pip install 'bmoe[ray]'"
    first = next((s.strip() for s in str(e).splitlines() if s.strip()), "")
    return f"the run failed: {type(e).__name__}: {first}"
