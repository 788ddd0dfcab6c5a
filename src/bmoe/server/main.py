"""bmoe-server: every bmoe-cli session flag, plus where to listen and how to guard it."""
from __future__ import annotations

import argparse
import os
import sys

from bmoe.cli import build_parser, config_from_args, model_from_args
from bmoe.errors import BmoeError

# bmoe-cli flags that choose a CLI mode; they mean nothing to a server.
_CLI_ONLY = (("prompt", "-p/--prompt"), ("session", "--session"), ("progress", "--progress"),
             ("list_archs", "--list-archs"), ("list_devices", "--list-devices"))


def build_server_parser() -> argparse.ArgumentParser:
    p = build_parser()
    p.prog = "bmoe-server"
    p.description = "Serve a GGUF model over HTTP (OpenAI chat API, decisions, a web page); docs/server.md."
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    g.add_argument("--api-key", default=os.environ.get("BMOE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every route but /health and the page "
                        "(default: $BMOE_API_KEY, else no auth)")
    g.add_argument("--max-queue", type=int, default=8,
                   help="requests that may wait behind the running one; more get 503 (default 8)")
    g.add_argument("--max-body-kb", type=int, default=1024, help="largest request body in KiB; more get 413 (default 1024)")
    g.add_argument("--no-decide", action="store_true", help="refuse /v1/decide (decide is on by default in the server)")
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default info)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_server_parser()
    args = parser.parse_args(argv)
    for name, flag in _CLI_ONLY:
        if getattr(args, name):
            parser.error(f"{flag} is a bmoe-cli mode; bmoe-server serves requests over HTTP")
    if args.max_queue < 0:
        parser.error(f"--max-queue must be >= 0, got {args.max_queue}")
    if args.max_body_kb < 1:
        parser.error(f"--max-body-kb must be >= 1, got {args.max_body_kb}")
    args.decide = not args.no_decide
    try:
        cfg = config_from_args(args, model_from_args(args, "bmoe-server"))
        from bmoe.session import Session

        session = Session(cfg)
    except BmoeError as e:
        print(f"bmoe-server: {e}", file=sys.stderr)
        return 1
    import uvicorn

    from bmoe.server.app import ServerSettings, close_app, create_app

    app = create_app(session, ServerSettings(api_key=args.api_key or None, max_queue=args.max_queue,
                                             max_body_bytes=args.max_body_kb * 1024))
    print(f"bmoe-server: {cfg.model} on http://{args.host}:{args.port}/", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    finally:
        close_app(app)
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
