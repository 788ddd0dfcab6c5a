"""Fixtures of the engine tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from bmoe.config import SessionConfig
from bmoe.session import Session


@pytest.fixture()
def open_tiny(tiny_models) -> Iterator[Callable[..., Session]]:
    """``open_tiny(arch="qwen3moe", **config)``: a Session on the tiny ``arch`` in Q8_0 (n_ctx 512,
    one thread unless given), closed after the test."""
    opened: list[Session] = []

    def _open(arch: str = "qwen3moe", **kw: object) -> Session:
        kw.setdefault("n_ctx", 512)
        kw.setdefault("n_threads", 1)
        s = Session(SessionConfig(model=tiny_models(arch, "q8_0"), **kw))
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.close()
