"""bmoe-server: every session flag (bmoe.flags.SESSION_FLAGS, as bmoe-cli), plus where to listen
and how to guard it."""

from __future__ import annotations

import argparse
import os
import sys

from bmoe.errors import ConfigError
from bmoe.flags import (
    PLAN_ONLY_HELP,
    add_session_flags,
    config_from_flags,
    model_from_flags,
    opening_failure,
    plan_only,
)
from bmoe.server.hosts import bound_name, normalize, parse_allowed

# bmoe-cli's modes mean nothing to a server: accepted by the parser only to be refused by name.
_CLI_MODES = (("-p", "--prompt"), ("--session",), ("--progress",), ("--json",), ("--list-archs",), ("--list-devices",))


def build_server_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bmoe-server",
        description="Serve a GGUF model over HTTP (OpenAI chat API, decisions, a web page); docs/server.md.",
    )
    add_session_flags(p, skip=("--decide",))  # on by default here; --no-decide below turns it off
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    g.add_argument(
        "--allowed-hosts",
        metavar="H,H",
        help="Host header names answered besides localhost, loopback addresses and --host "
        "(names or addresses separated by commas, any port; * answers every host); "
        "other hosts get 400, against DNS rebinding (default: none)",
    )
    g.add_argument(
        "--api-key",
        default=os.environ.get("BMOE_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every route but /health and the page "
        "(default: $BMOE_API_KEY, else no auth)",
    )
    g.add_argument(
        "--max-queue",
        type=int,
        default=8,
        help="requests that may wait behind the running one; more get 503 (default 8)",
    )
    g.add_argument(
        "--max-body-kb", type=int, default=1024, help="largest request body in KiB; more get 413 (default 1024)"
    )
    g.add_argument(
        "--max-request-decisions",
        type=int,
        default=32,
        metavar="N",
        help="the most decisions one /v1/decide request may run (a debias permutation, a pride sample "
        "and a choice scored in full count one each); more get 400 before any work (default 32)",
    )
    d = p.add_mutually_exclusive_group()
    d.add_argument("--decide", action="store_true", help="accept /v1/decide (the default)")
    d.add_argument("--no-decide", action="store_true", help="refuse /v1/decide (decide is on by default in the server)")
    g.add_argument("--debug", action="store_true", help="on a fatal error, print the Python traceback too")
    g.add_argument("--plan-only", action="store_true", help=PLAN_ONLY_HELP)
    for names in _CLI_MODES:
        p.add_argument(*names, dest="cli_mode", action="append_const", const="/".join(names), help=argparse.SUPPRESS)
    g.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default info)",
    )
    return p


def allowed_hosts(args: argparse.Namespace) -> tuple[str, ...]:
    """ServerSettings.allowed_hosts from --host and --allowed-hosts (ValueError on a bad entry)."""
    extra = parse_allowed(args.allowed_hosts) if args.allowed_hosts is not None else ()
    if extra == ("*",):
        return extra
    bound = bound_name(args.host)
    return tuple(dict.fromkeys(((bound,) if bound else ()) + extra))


def server_settings(args: argparse.Namespace, extra: list[str]) -> dict:
    """bmoe-server's own flags, checked (ConfigError naming the first wrong one), as
    ``ServerSettings``' fields: what bmoe-server and bmoe.ray.serve's ``build`` both run."""
    if args.cli_mode:
        raise ConfigError(f"{args.cli_mode[0]} is a bmoe-cli mode; bmoe-server serves requests over HTTP")
    if extra:
        raise ConfigError(f"unrecognized arguments: {' '.join(extra)}")
    if args.max_queue < 0:
        raise ConfigError(f"--max-queue must be >= 0, got {args.max_queue}")
    if args.max_body_kb < 1:
        raise ConfigError(f"--max-body-kb must be >= 1, got {args.max_body_kb}")
    if args.max_request_decisions < 1:
        raise ConfigError(f"--max-request-decisions must be >= 1, got {args.max_request_decisions}")
    try:
        hosts = allowed_hosts(args)
    except ValueError as e:
        raise ConfigError(f"--allowed-hosts: {e}") from None
    return {
        "api_key": args.api_key or None,
        "max_queue": args.max_queue,
        "max_body_bytes": args.max_body_kb * 1024,
        "max_request_decisions": args.max_request_decisions,
        "allowed_hosts": hosts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = build_server_parser()
    args, extra = parser.parse_known_args(argv)
    try:
        settings = server_settings(args, extra)
    except ConfigError as e:
        parser.error(str(e))
    hosts = settings["allowed_hosts"]
    if args.plan_only:
        try:
            return plan_only(
                config_from_flags(args, model_from_flags(args, "bmoe-server"), decide=not args.no_decide), "bmoe-server"
            )
        except Exception as e:
            print(f"bmoe-server: {opening_failure(e)}", file=sys.stderr)
            return 1
    try:  # the server extra, before the model is opened: a missing one is one line, not a traceback
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as e:
        print(
            f"bmoe-server: the server extra is not installed ({e.name} is missing): pip install 'bmoe[server]'",
            file=sys.stderr,
        )
        return 1
    try:
        cfg = config_from_flags(args, model_from_flags(args, "bmoe-server"), decide=not args.no_decide)
        from bmoe.session import Session

        session = Session(cfg)
    except Exception as e:
        if args.debug:
            import traceback

            traceback.print_exception(e)
        print(f"bmoe-server: {opening_failure(e)}", file=sys.stderr)
        return 1

    from bmoe.server.app import ServerSettings, close_app, create_app

    app = create_app(session, ServerSettings(**settings))
    print(f"bmoe-server: {cfg.model} on http://{args.host}:{args.port}/", file=sys.stderr, flush=True)
    if not hosts and normalize(args.host) in ("0.0.0.0", "::"):
        print(
            "bmoe-server: listening on every address, but answering only requests for localhost and loopback "
            "addresses; name the others with --allowed-hosts",
            file=sys.stderr,
            flush=True,
        )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    finally:
        close_app(app)
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
