"""Flags are a public contract: every flag bmoe-cli and bmoe-server take is documented."""

from __future__ import annotations

import argparse
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _long_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {
        s
        for a in parser._actions
        if a.help != argparse.SUPPRESS
        for s in a.option_strings
        if s.startswith("--") and s != "--help"
    }


def _rows(*names: str) -> list[str]:
    """The first cell of every table row in these docs."""
    return [
        line.split("|")[1]
        for n in names
        for line in (DOCS / n).read_text().splitlines()
        if line.startswith("|") and line.count("|") > 2
    ]


def _documented(flag: str, cells: list[str]) -> bool:
    return any(f"`{flag}`" in c or f"`{flag} " in c for c in cells)


def test_every_cli_flag_has_a_row_in_cli_md() -> None:
    from bmoe.cli import build_parser

    cells = _rows("cli.md")
    assert sorted(f for f in _long_flags(build_parser()) if not _documented(f, cells)) == []


def test_every_server_flag_has_a_row_in_server_md_or_cli_md() -> None:
    from bmoe.server.main import build_server_parser

    cells = _rows("server.md", "cli.md")
    assert sorted(f for f in _long_flags(build_server_parser()) if not _documented(f, cells)) == []


def test_every_batch_flag_has_a_row_in_scale_out_md_or_cli_md() -> None:
    from bmoe.ray.batch import build_batch_parser

    cells = _rows("scale-out.md", "cli.md")
    assert sorted(f for f in _long_flags(build_batch_parser()) if not _documented(f, cells)) == []


def test_the_check_sees_a_missing_row() -> None:
    assert not _documented("--twin-dir", [" `--gc-twins [MAX_MB]` ", " see `--twin-dir` "][:1])
    assert _documented("--cache-mb", [" `--cache-mb N\\|auto` "])


def test_readme_gives_the_decide_batch_range_the_config_enforces(tmp_path: Path) -> None:
    """README's batch example names the --decide-batch range SessionConfig accepts, and no other cap."""
    import pytest

    from bmoe.config import ConfigError, SessionConfig, validate

    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    validate(SessionConfig(model=model, decide=True, decide_batch=255))
    with pytest.raises(ConfigError, match=r"^decide_batch: at most 255 "):
        validate(SessionConfig(model=model, decide=True, decide_batch=256))
    readme = " ".join((DOCS.parent / "README.md").read_text().split())
    assert "(`--decide-batch N`, 2 to 255;" in readme and "up to 16" not in readme
