"""The callable class Ray Data runs as an actor pool: one Session per actor, opened once.

Ray Data hands ``__call__`` a batch of rows as numpy columns (``index``, ``line``) and takes back
``index`` and ``result`` (the result object as JSON text). A session that breaks for good (a
streaming read error) cannot answer the batch or any later one, so the actor ends its own process:
Ray counts that as an actor failure, restarts the actor (a new process, a fresh session) and
retries the batch there, up to ``max_restarts`` times.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

from bmoe.config import SessionConfig
from bmoe.ray.data.rows import STICKY, answer_lines
from bmoe.session import Session

EXIT_BROKEN = 75  # the exit status of an actor whose session broke (EX_TEMPFAIL: retry elsewhere)


class SessionActor:
    def __init__(self, config: dict[str, Any]) -> None:
        # Rebuilt (and so checked) here: the model path must exist on the node the actor runs on.
        self.session = Session(SessionConfig(**config))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        lines = [str(x) for x in batch["line"]]
        try:
            results = answer_lines(self.session, lines)
        except STICKY as e:
            print(
                f"bmoe actor {os.getpid()}: {e}; ending this actor so Ray retries the batch on a new one",
                file=sys.stderr,
                flush=True,
            )
            os._exit(EXIT_BROKEN)
        text = [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in results]
        return {"index": np.asarray(batch["index"], dtype=np.int64), "result": np.asarray(text, dtype=object)}
