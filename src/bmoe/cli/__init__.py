"""bmoe-cli: the command-line edge (one-shot answers and the --session line protocol)."""

from bmoe.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
