"""Gates: exactness properties checked bit for bit on the tiny models.

Every session in a gate loads the model with the same parameters (mmap, no repacked
buffers), whether it streams or not, so both sides run the same kernels.
"""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bmoe.config import SessionConfig
from bmoe.session import Session


@pytest.fixture()
def open_session() -> Iterator[Callable[..., Session]]:
    opened: list[Session] = []

    def _open(model: Path, **kw: object) -> Session:
        kw.setdefault("n_ctx", 512)
        kw.setdefault("n_predict", 16)
        kw.setdefault("n_threads", 1)  # many small graphs per token: threads only add barrier waits here
        s = Session(SessionConfig(model=model, **kw))
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.close()
