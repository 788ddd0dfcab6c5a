"""Flags are a public contract: every flag bmoe-cli and bmoe-server take is documented."""
from __future__ import annotations

import argparse
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _long_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings
            if s.startswith("--") and s != "--help"}


def test_every_cli_flag_has_a_row_in_cli_md() -> None:
    from bmoe.cli import build_parser

    text = (DOCS / "cli.md").read_text()
    assert sorted(f for f in _long_flags(build_parser()) if f"`{f}" not in text) == []


def test_every_server_flag_is_in_server_md_or_cli_md() -> None:
    from bmoe.server.main import build_server_parser

    text = (DOCS / "server.md").read_text() + (DOCS / "cli.md").read_text()
    assert sorted(f for f in _long_flags(build_server_parser()) if f"`{f}" not in text) == []
