"""bmoe-batch: answer a JSONL file of decide (and generate) requests, in this process or on Ray.

Every non-blank input line is one row (a line of the session line protocol; rows.py); the output
file gets one JSON object per row, in input order. Session flags are bmoe-cli's (decide is always
on); docs/scale-out.md lists the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bmoe.errors import BmoeError
from bmoe.flags import add_session_flags, config_from_flags, int_at_least, model_from_flags, opening_failure
from bmoe.out_paths import not_regular
from bmoe.ray.data.run import LOCAL, RayOptions, answer, pride_refusal
from bmoe.ray.flags import add_actor_flags, run_failure
from bmoe.wire.protocol import MAX_LINE_BYTES, ProtocolError, decode_line, line_too_long, read_lines

JSON_SPACE = " \t\r\n"


_positive = int_at_least(1)
_non_negative = int_at_least(0)


def build_batch_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bmoe-batch",
        description="Answer a JSONL file of decide requests (one protocol line each; generate lines too) and "
        "write one result object per line, in input order; on Ray with --ray (docs/scale-out.md).",
    )
    p.add_argument("data", type=Path, metavar="DATA.jsonl", help="the requests, one JSON object per line")
    g = p.add_argument_group("batch")
    g.add_argument("--out", type=Path, required=True, metavar="FILE", help="where the results go (JSONL)")
    g.add_argument(
        "--ray",
        metavar="ADDRESS|local",
        help="run on a Ray cluster at ADDRESS (host:port of its head, auto, ray://...), or on a Ray "
        "instance started here with 'local' (default: no Ray, one session in this process)",
    )
    g.add_argument("--actors", type=_positive, default=1, metavar="N", help="Ray actors, one session each (default 1)")
    g.add_argument(
        "--batch-rows", type=_positive, default=32, metavar="N", help="rows per batch handed to an actor (default 32)"
    )
    add_actor_flags(g)
    g.add_argument(
        "--flash-resource",
        metavar="NAME",
        help="a custom Ray resource each actor takes one unit of, e.g. one per flash device",
    )
    g.add_argument(
        "--max-restarts",
        type=_non_negative,
        default=3,
        metavar="N",
        help="times a failed actor is restarted and its batch retried (default 3)",
    )
    add_session_flags(p, skip=("--decide",))  # decide is always on here
    return p


def read_rows(path: Path) -> tuple[list[str], dict[int, dict]]:
    """The rows of ``path`` (its non-blank lines as text) and the answers of those that are already
    refused here (not UTF-8, longer than a protocol line may be), by row index."""
    rows: list[str] = []
    refused: dict[int, dict] = {}
    with open(path, "rb") as f:
        for raw in read_lines(f):  # an over-long line is dropped as it is read, never held whole
            try:
                if raw is None or len(raw) > MAX_LINE_BYTES:  # here a "\r" counts toward the limit
                    raise line_too_long()
                text = decode_line(raw)
            except ProtocolError as e:
                refused[len(rows)] = {"id": None, "error": str(e)}
                rows.append("")
                continue
            if text.strip(JSON_SPACE):
                rows.append(text)
    return rows, refused


def out_refusal(out: Path, data: Path) -> str | None:
    """Why the results cannot go to ``out``, found before any row is read or answered (a run that
    cannot write its results would be lost whole); None when they can. ``out`` may not be the
    input file by any name (another path, a symbolic or hard link), and a file must be creatable
    in its folder: the results are written there and renamed into place."""
    what = not_regular(out)
    if what is not None:
        return (
            f"--out: {out} is {what}; give the path of a regular file, or of one that does not exist yet "
            "(the results are written beside it and renamed over it)"
        )
    try:
        same = out.exists() and os.path.samefile(out, data)
    except OSError:  # the data cannot be looked at: its own refusal follows
        same = False
    if same:
        return f"--out: {out} is the input file {data}; give another path (the results would replace the data)"
    try:
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}.", suffix=".probe"):
            pass
    except OSError as e:
        return f"--out: cannot write {out}: {e.strerror or e}"
    return None


def write_results(path: Path, results: list[dict]) -> None:
    """All results, one JSON object per line; written to a new file beside ``path`` and renamed,
    so a failed run never leaves half a file (nor touches another file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    f = open(tmp, "x", encoding="utf-8")
    try:
        with f:
            for r in results:
                f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = build_batch_parser()
    args = parser.parse_args(argv)
    refusal = out_refusal(args.out, args.data)
    if refusal is not None:
        print(f"bmoe-batch: {refusal}", file=sys.stderr)
        return 1
    try:
        rows, refused = read_rows(args.data)
    except OSError as e:
        print(f"bmoe-batch: cannot read {args.data}: {e.strerror or e}", file=sys.stderr)
        return 1
    try:
        cfg = config_from_flags(args, model_from_flags(args, "bmoe-batch"), decide=True)
        options = (
            None
            if args.ray is None
            else RayOptions(
                address=args.ray,
                actors=args.actors,
                batch_rows=args.batch_rows,
                num_cpus=args.actor_cpus,
                memory_mb=args.actor_memory_mb,
                flash_resource=args.flash_resource,
                max_restarts=args.max_restarts,
            )
        )
    except Exception as e:
        print(f"bmoe-batch: {opening_failure(e)}", file=sys.stderr)
        return 1
    todo = [i for i in range(len(rows)) if i not in refused]
    refusal = pride_refusal([rows[i] for i in todo]) if options is not None else None
    if refusal is not None:  # before Ray starts: each actor would estimate its own prior
        print(f"bmoe-batch: {refusal}", file=sys.stderr)
        return 1
    start = time.perf_counter()
    try:
        answered = answer([rows[i] for i in todo], cfg, options) if todo else []
    except BmoeError as e:
        print(f"bmoe-batch: {opening_failure(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # the ray extra missing, Ray's own failures: one line
        print(f"bmoe-batch: {run_failure(e)}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - start
    results = [refused[i] if i in refused else {} for i in range(len(rows))]
    for i, r in zip(todo, answered, strict=True):
        results[i] = r
    try:
        write_results(args.out, results)
    except OSError as e:
        print(f"bmoe-batch: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
        return 1
    errors = sum(1 for r in results if "error" in r)
    where = (
        "in this process"
        if options is None
        else f"on Ray ({'a local instance' if options.address == LOCAL else options.address}, {options.actors} actor(s))"
    )
    rate = len(todo) / seconds if seconds > 0 else 0.0
    print(
        f"bmoe-batch: {len(results)} rows ({errors} refused or failed) in {seconds:.2f} s, {rate:.2f} rows/s, "
        f"{where}; results in {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
