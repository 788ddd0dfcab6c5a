"""bmoe-eval's flags are documented: its own in docs/eval.md, the session flags it shares with
bmoe-cli in docs/cli.md; and the flags it leaves out are the ones docs/eval.md says it leaves out."""

from __future__ import annotations

import argparse
from pathlib import Path

from bmoe.config import DECIDE_BATCH_AUTO
from bmoe.eval.main import RAY_BATCH_ROWS, SKIPPED_FLAGS, build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _first_cells(*names: str) -> list[str]:
    return [
        line.split("|")[1]
        for n in names
        for line in (DOCS / n).read_text().splitlines()
        if line.startswith("|") and line.count("|") > 2
    ]


def _long_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {
        s
        for a in parser._actions
        if a.help != argparse.SUPPRESS
        for s in a.option_strings
        if s.startswith("--") and s != "--help"
    }


def test_every_bmoe_eval_flag_has_a_row() -> None:
    cells = _first_cells("eval.md", "cli.md")
    missing = [f for f in sorted(_long_flags(build_parser())) if not any(f"`{f}`" in c or f"`{f} " in c for c in cells)]
    assert missing == []


def test_the_left_out_session_flags_are_named_in_eval_md() -> None:
    text = (DOCS / "eval.md").read_text()
    assert all(f"`{f}`" in text for f in SKIPPED_FLAGS)
    assert not _long_flags(build_parser()) & set(SKIPPED_FLAGS)


def test_the_batch_row_gives_both_defaults() -> None:
    row = next(c for c in (DOCS / "eval.md").read_text().splitlines() if c.startswith("| `--batch N` |"))
    assert (
        row.split("|")[2].strip()
        == f"the batch width (`--decide-batch N`, {DECIDE_BATCH_AUTO} with `auto`); with `--ray`, max(that, {RAY_BATCH_ROWS})"
    )
