"""Sending a data set's rows through a session: grouped by prefix, in chunks, by decide_many.

Rows with the same prefix text are sent together (in input order within the group; groups in the
order of their first row), ``batch`` at most per ``Session.decide_many`` call. With
``--decide-batch N`` > 1 the session prefills a chunk's decisions that keep the same prefix side by
side; with 1 it answers them one by one, restoring the kept prefix for each.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bmoe.decide.types import DecideResult
from bmoe.eval.dataset import Row
from bmoe.session import Session
from bmoe.wire.records import decide_fields


def chunks(rows: Sequence[Row], size: int) -> list[list[Row]]:
    """``rows`` grouped by prefix text, each group cut into pieces of at most ``size``."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.request.prefix, []).append(row)
    return [group[i : i + size] for group in groups.values() for i in range(0, len(group), size)]


def result_row(row: Row, result: DecideResult) -> dict:
    """One line of results.jsonl: the BMOE_DECIDE object (its ``id`` is the line number) plus the
    data's own fields."""
    out = dict(decide_fields(result))
    out["line"] = row.line
    out["gold"] = row.gold
    if row.data_id is not None:
        out["data_id"] = row.data_id
    if row.split is not None:
        out["split"] = row.split
    return out


@dataclass
class RunCounts:
    decided: int = 0
    kept_hits: int = 0  # answers with n_reused > 0
    batch_ids: set[int] = field(default_factory=set)
    seconds: float = 0.0

    @property
    def per_s(self) -> float:
        return self.decided / self.seconds if self.seconds > 0 else 0.0


def run(session: Session, pieces: Sequence[Sequence[Row]], on_result: Callable[[Row, DecideResult], None],
        counts: RunCounts) -> None:
    """Answer every piece with one ``decide_many`` call each, counting into ``counts``;
    ``on_result`` sees each answer as soon as its piece is done (store it there: an interruption
    loses only the piece in flight)."""
    start = time.perf_counter()
    try:
        for piece in pieces:
            for row, result in zip(piece, session.decide_many([r.request for r in piece]), strict=True):
                counts.decided += 1
                if result.error is None and result.n_reused > 0:
                    counts.kept_hits += 1
                if result.batch is not None:
                    counts.batch_ids.add(result.batch.id)
                on_result(row, result)
    finally:
        counts.seconds += time.perf_counter() - start
