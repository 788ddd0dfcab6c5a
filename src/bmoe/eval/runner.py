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
from typing import TYPE_CHECKING

from bmoe.decide.types import DecideResult
from bmoe.eval.dataset import Row
from bmoe.session import Session
from bmoe.wire.records import decide_fields

if TYPE_CHECKING:
    from bmoe.config import SessionConfig
    from bmoe.ray.data import RayOptions


def chunks(rows: Sequence[Row], size: int) -> list[list[Row]]:
    """``rows`` grouped by prefix text, each group cut into pieces of at most ``size``."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.request.prefix, []).append(row)
    return [group[i : i + size] for group in groups.values() for i in range(0, len(group), size)]


def result_row(row: Row, result: DecideResult) -> dict:
    """One line of results.jsonl: the BMOE_DECIDE object (its ``id`` is the line number) plus the
    data's own fields."""
    return answer_row(row, decide_fields(result))


def answer_row(row: Row, answer: dict) -> dict:
    """``result_row`` from the BMOE_DECIDE object itself (what a Ray actor sends back)."""
    out = dict(answer)
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

    def count(self, answer: dict) -> None:
        """Count one BMOE_DECIDE object. A batch is known by its figures: ``batch_id`` numbers
        the batches of one session, and on Ray each actor has its own session."""
        self.decided += 1
        if answer.get("error") is None and answer.get("n_reused", 0) > 0:
            self.kept_hits += 1
        if "batch_id" in answer:
            self.batch_ids.add(
                hash((answer["batch_id"], answer["batch_size"], answer["batch_tokens"], answer["batch_prefill_s"]))
            )

    @property
    def per_s(self) -> float:
        return self.decided / self.seconds if self.seconds > 0 else 0.0


def run(
    session: Session, pieces: Sequence[Sequence[Row]], on_result: Callable[[Row, DecideResult], None], counts: RunCounts
) -> None:
    """Answer every piece with one ``decide_many`` call each, counting into ``counts``;
    ``on_result`` sees each answer as soon as its piece is done (store it there: an interruption
    loses only the piece in flight)."""
    start = time.perf_counter()
    try:
        for piece in pieces:
            for row, result in zip(piece, session.decide_many([r.request for r in piece]), strict=True):
                counts.count(decide_fields(result))
                on_result(row, result)
    finally:
        counts.seconds += time.perf_counter() - start


def run_ray(
    rows: Sequence[Row],
    config: SessionConfig,
    options: RayOptions,
    on_answer: Callable[[Row, dict], None],
    counts: RunCounts,
) -> None:
    """Answer ``rows`` on a Ray actor pool (bmoe.ray.data: rows grouped by prefix, each actor's
    batches through its own session's ``decide_many``); ``on_answer`` sees each BMOE_DECIDE object
    as its batch finishes, in any order. Every row is answered exactly once or RowsLost is raised."""
    from bmoe.ray.data import RayRun, decide_line
    from bmoe.ray.data.run import in_order

    start = time.perf_counter()
    seen: list[tuple[int, dict]] = []
    try:
        for index, answer in RayRun([decide_line(r.request) for r in rows], config, options):
            seen.append((index, answer))
            counts.count(answer)
            on_answer(rows[index], answer)
    finally:
        counts.seconds += time.perf_counter() - start
    in_order(seen, len(rows))  # raises unless each row came back exactly once
