"""Decisions and generations over a data set, on one session or a pool of Ray actors.

Rows are lines of the session line protocol; results are the objects the session would print
(``BMOE_DECIDE``/``BMOE_DONE``), in input order. See docs/scale-out.md.
"""

from bmoe.ray.data.rows import answer_lines, decide_line, prefix_key
from bmoe.ray.data.run import LOCAL, RayOptions, RayRun, RowsLost, answer, answer_local, decide_dataset, in_order
from bmoe.ray.data.sizing import ActorSizing, actor_sizing

__all__ = [
    "LOCAL",
    "ActorSizing",
    "RayOptions",
    "RayRun",
    "RowsLost",
    "actor_sizing",
    "answer",
    "answer_local",
    "answer_lines",
    "decide_dataset",
    "decide_line",
    "in_order",
    "prefix_key",
]
