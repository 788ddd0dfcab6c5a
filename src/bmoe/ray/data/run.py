"""Running rows through sessions: in this process, or over a Ray Dataset with an actor pool.

Rows are protocol lines (rows.py). Before batching, rows are sorted by prefix (stable), so a
batch holds whole prefix groups and an actor's kept prefix state is hit (rows with
``"debias": "pride"`` first and in input order: their answers depend on the order a session
answers them in, and on Ray they are refused); every row carries its
input index, and the results are put back in input order and checked: exactly one result per
index, or ``RowsLost`` says which were missing or duplicated.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bmoe.config import SessionConfig
from bmoe.errors import BmoeError, ConfigError
from bmoe.ray.data.rows import answer_lines, is_pride, order_key
from bmoe.ray.data.sizing import ActorSizing, actor_sizing
from bmoe.session import Session

LOCAL = "local"


class RowsLost(BmoeError):
    """The results do not hold exactly one answer per input row."""


@dataclass(frozen=True, slots=True)
class RayOptions:
    """How to run on Ray: ``address`` is ``local`` (start a Ray instance on this machine) or a
    cluster's address (``host:port`` of its head, ``auto``, or ``ray://host:port``)."""

    address: str = LOCAL
    actors: int = 1
    batch_rows: int = 32  # rows per batch handed to an actor
    num_cpus: float = 1.0  # per actor; also its llama.cpp threads when the config leaves threads at 0
    memory_mb: int | None = None  # per actor; None: computed (sizing.py)
    flash_resource: str | None = None  # a custom resource each actor takes one unit of
    max_restarts: int = 3  # per actor, and retries per batch

    def __post_init__(self) -> None:
        for name, lo in (("actors", 1), ("batch_rows", 1), ("max_restarts", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{name}: must be an integer >= {lo}, got {v!r}")
        if self.memory_mb is not None and (not isinstance(self.memory_mb, int) or self.memory_mb < 1):
            raise ConfigError(f"memory_mb: must be an integer >= 1, got {self.memory_mb!r}")
        if not self.address:
            raise ConfigError("address: give local or a Ray cluster's address")


def in_order(pairs: Iterable[tuple[int, dict]], n: int) -> list[dict]:
    """The results of rows 0..n-1 in input order; RowsLost unless each index came exactly once."""
    got: dict[int, dict] = {}
    duplicated: list[int] = []
    for index, result in pairs:
        if index in got or not 0 <= index < n:
            duplicated.append(index)
        got[index] = result
    missing = [i for i in range(n) if i not in got]
    if missing or duplicated:
        raise RowsLost(
            f"{len(missing)} row(s) missing {missing[:10]}, {len(duplicated)} duplicated or unknown "
            f"{duplicated[:10]} of {n}"
        )
    return [got[i] for i in range(n)]


def _sorted_rows(lines: Sequence[str]) -> list[dict[str, Any]]:
    keyed = [(order_key(line), i, line) for i, line in enumerate(lines)]
    keyed.sort(key=lambda t: t[0])  # stable: input order within a prefix, and among the pride rows
    return [{"index": i, "line": line} for _, i, line in keyed]


def pride_refusal(lines: Sequence[str]) -> str | None:
    """Why ``lines`` cannot run on Ray, or None: rows with ``"debias": "pride"``, whose prior a
    session estimates from the first such rows it answers (bmoe-eval refuses them in the same words)."""
    n = sum(map(is_pride, lines))
    if not n:
        return None
    return (
        f'--ray: {n} rows use "debias": "pride", whose prior a session estimates from the first rows it '
        f'answers; each Ray actor has its own session and gets the rows in another order, so the answers '
        f'would not be those of one process; run them without --ray'
    )


def answer_local(lines: Sequence[str], config: SessionConfig) -> list[dict]:
    """Every row answered by one Session in this process, results in input order."""
    rows = _sorted_rows(lines)
    with Session(config) as session:
        results = answer_lines(session, [r["line"] for r in rows])
    return in_order(((r["index"], res) for r, res in zip(rows, results, strict=True)), len(lines))


def actor_config(config: SessionConfig, options: RayOptions) -> dict[str, Any]:
    """The SessionConfig fields an actor opens its session with: llama.cpp threads default to the
    actor's CPUs rather than every core of its node."""
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    if config.n_threads == 0:
        fields["n_threads"] = max(1, int(options.num_cpus))
    return fields


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` (or start a local one) unless this process already has."""
    import ray

    if ray.is_initialized():
        return
    if address == LOCAL:
        ray.init(logging_level=logging.WARNING, include_dashboard=False)
    else:
        ray.init(address=address, logging_level=logging.WARNING)


def sizing(config: SessionConfig, options: RayOptions) -> ActorSizing:
    return actor_sizing(
        config, num_cpus=options.num_cpus, memory_mb=options.memory_mb, flash_resource=options.flash_resource
    )


def decide_dataset(ds: Any, config: SessionConfig, options: RayOptions) -> Any:
    """``ds`` (rows with ``index`` and ``line``) mapped through a pool of ``options.actors``
    SessionActors; the result has ``index`` and ``result`` (JSON text) and is lazy, as Ray
    Datasets are."""
    from ray.data import ActorPoolStrategy

    from bmoe.ray.data.actor import SessionActor

    size = sizing(config, options)
    # Ray Data restarts a dead actor and retries its batch without end by default; bounded here,
    # so a model that kills every actor that opens it fails the run instead of looping.
    retries = {"max_restarts": options.max_restarts, "max_task_retries": options.max_restarts}
    return ds.map_batches(
        SessionActor,
        fn_constructor_kwargs={"config": actor_config(config, options)},
        batch_size=options.batch_rows,
        batch_format="numpy",
        compute=ActorPoolStrategy(size=options.actors),
        num_cpus=size.num_cpus,
        memory=size.memory,
        resources=size.resources or None,
        ray_remote_args_fn=lambda: dict(retries),
    )


class RayRun:
    """Rows over a Ray Dataset. Iterate it for ``(index, result)`` pairs as batches finish (in
    any order), or call ``results()`` for all of them in input order, checked."""

    def __init__(self, lines: Sequence[str], config: SessionConfig, options: RayOptions) -> None:
        refusal = pride_refusal(lines)
        if refusal is not None:
            raise ConfigError(refusal)
        import ray.data

        import ray

        self.sizing = sizing(config, options)  # a refusal before Ray starts
        connect(options.address)
        ray.data.DataContext.get_current().enable_progress_bars = False
        self.n = len(lines)
        self.dataset = decide_dataset(ray.data.from_items(_sorted_rows(lines)), config, options) if lines else None

    def __iter__(self) -> Iterator[tuple[int, dict]]:
        if self.dataset is None:
            return
        for row in self.dataset.iter_rows():
            yield int(row["index"]), json.loads(row["result"])

    def results(self) -> list[dict]:
        return in_order(iter(self), self.n)


def answer(lines: Sequence[str], config: SessionConfig, options: RayOptions | None = None) -> list[dict]:
    """One result object per row, in input order: on Ray with ``options``, else in this process."""
    if options is None:
        return answer_local(lines, config)
    return RayRun(lines, config, options).results()
