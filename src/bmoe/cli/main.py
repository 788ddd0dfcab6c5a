"""bmoe-cli: flags -> SessionConfig; one-shot answer or the --session line protocol."""

from __future__ import annotations

import argparse
import sys

from bmoe.errors import BmoeError
from bmoe.flags import (
    PLAN_ONLY_HELP,
    add_session_flags,
    config_from_flags,
    model_from_flags,
    opening_failure,
    plan_only,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bmoe-cli", description="Run a (MoE) GGUF model on CPU, streaming experts from flash."
    )
    add_session_flags(p)
    a = p.add_argument
    a("-p", "--prompt", help="one-shot: the prompt to answer")
    mode = p.add_mutually_exclusive_group()  # argparse refuses --json with --session (exit 2)
    mode.add_argument(
        "--session", action="store_true", help="read JSON requests from stdin, one per line (docs/protocol.md)"
    )
    mode.add_argument(
        "--json",
        action="store_true",
        help="one-shot: stdout gets one line, the BMOE_DONE object (its \"text\" is the answer), "
        "instead of the answer text",
    )
    a("--progress", action="store_true", help="one-shot: print BMOE_PROGRESS lines too (on stderr)")
    a("--list-archs", action="store_true", help="print the architectures --moe-stream supports and exit")
    a("--list-devices", action="store_true", help="print the devices this llama-cpp-python provides and exit")
    a(
        "--gc-twins",
        nargs="?",
        const=True,
        default=False,
        type=_gc_budget,
        metavar="MAX_MB",
        help="remove the dense twins (--twin-dir) of model files that are gone or changed, then, with "
        "MAX_MB, the least recently used ones until the rest take at most MAX_MB MiB; print them and exit",
    )
    a("--plan-only", action="store_true", help=PLAN_ONLY_HELP)
    a("--debug", action="store_true", help="on a fatal error, print the Python traceback too")
    return p


def _gc_budget(text: str) -> int:
    try:
        mib = int(text)
    except ValueError:
        mib = -1
    if mib < 0:
        raise argparse.ArgumentTypeError(f"MAX_MB must be an integer >= 0 (MiB), got {text!r}")
    return mib


def gc_twins_main(args: argparse.Namespace) -> int:
    """--gc-twins: one line per removed twin, then a summary line; exit 0 (1 if one cannot be removed)."""
    from bmoe.tools import default_twin_dir, gc_twins

    cache = args.twin_dir or default_twin_dir()
    budget = None if args.gc_twins is True else args.gc_twins << 20
    try:
        report = gc_twins(cache, budget)
    except BmoeError as e:
        print(f"bmoe-cli: --gc-twins: {e}", file=sys.stderr)
        return 1
    for gone in report.removed:
        print(f"removed {gone.path} ({gone.why}, {gone.nbytes / 2**20:.1f} MiB)")
    freed, left = sum(g.nbytes for g in report.removed), sum(k.nbytes for k in report.kept)
    n = len(report.removed)
    print(
        f"bmoe-cli: --gc-twins: removed {n} twin{'' if n == 1 else 's'} ({freed / 2**20:.1f} MiB), "
        f"kept {len(report.kept)} ({left / 2**20:.1f} MiB) in {cache}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.session and (args.prompt is not None or args.progress):
        # one-shot flags a session would silently ignore (exit 2, as argparse's own refusals)
        parser.error(
            f"argument --session: not allowed with argument {'-p/--prompt' if args.prompt is not None else '--progress'}"
        )
    if args.plan_only:  # it prints the plan and exits: a prompt or a session it would silently not run
        given = next(
            (
                flag
                for flag, on in (
                    ("-p/--prompt", args.prompt is not None),
                    ("--session", args.session),
                    ("--json", args.json),
                    ("--progress", args.progress),
                )
                if on
            ),
            None,
        )
        if given is not None:
            parser.error(f"argument --plan-only: not allowed with argument {given} (it prints the plan and exits)")
    if args.list_archs:
        from bmoe.tools import format_archs

        print(format_archs())
        return 0
    if args.list_devices:
        from bmoe.tools import format_devices, list_devices

        print(format_devices(list_devices()))
        return 0
    if args.gc_twins is not False:
        return gc_twins_main(args)
    if args.plan_only:
        try:
            return plan_only(config_from_flags(args, model_from_flags(args, "bmoe-cli")), "bmoe-cli")
        except Exception as e:
            return _fatal(args, e)
    if not args.session and args.prompt is None:
        print("bmoe-cli: give -p PROMPT for one answer, or --session for the line protocol", file=sys.stderr)
        return 2
    try:
        cfg = config_from_flags(args, model_from_flags(args, "bmoe-cli"))
        from bmoe.session import Session

        session = Session(cfg)
    except Exception as e:  # a bug too: still one line, the traceback only with --debug
        return _fatal(args, e)
    with session:
        if args.session:
            from bmoe.cli.loop import run_session

            return run_session(session, sys.stdin, sys.stdout)
        from bmoe.cli.oneshot import run_oneshot

        try:
            return run_oneshot(
                session, args.prompt, progress=args.progress, out=sys.stdout, err=sys.stderr, as_json=args.json
            )
        except BmoeError as e:
            print(f"bmoe-cli: {e}", file=sys.stderr)
            return 1


def _fatal(args: argparse.Namespace, exc: BaseException) -> int:
    """A session that could not open: one line on stderr (and one fatal BMOE_ERROR line on stdout
    with --session), exit 1; the traceback only with --debug."""
    msg = opening_failure(exc)
    if args.debug:
        import traceback

        traceback.print_exception(exc)
    if args.session:
        from bmoe.wire.records import error

        print(error(None, msg, fatal=True), flush=True)
    print(f"bmoe-cli: {msg}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
