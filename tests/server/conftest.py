"""Server fixtures: apps over real sessions (SmolLM2 and a tiny MoE), and a live uvicorn on
127.0.0.1 (a free port, in a thread of this process, stopped at teardown with a bound wait)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI  # noqa: E402

from bmoe.config import SessionConfig  # noqa: E402
from bmoe.server import ServerSettings, close_app, create_app  # noqa: E402
from bmoe.session import Session  # noqa: E402
from helpers.server import LiveServer  # noqa: E402


@pytest.fixture(scope="session")
def smol_path() -> Path:
    from bmoe.testing import smollm2_gguf_path

    return smollm2_gguf_path()


@pytest.fixture(scope="session")
def tiny_path(tiny_models: Callable[[str, str], Path]) -> Path:
    return tiny_models("qwen3moe", "q8_0")


AppFactory = Callable[..., FastAPI]


@pytest.fixture()
def make_app() -> Iterator[AppFactory]:
    """``make_app(model_path, settings=None, **session_config) -> FastAPI``; closed at teardown."""
    opened: list[tuple[FastAPI, Session]] = []

    def _make(model: Path, settings: ServerSettings | None = None, **kw: object) -> FastAPI:
        kw.setdefault("n_ctx", 1024)
        kw.setdefault("n_predict", 16)
        kw.setdefault("decide", True)
        # One thread: llama.cpp's workers sync at a barrier per op, and on a shared 2-core CI box
        # (other jobs running) two threads stall there; measured 0.7 s vs 12.7 s to first token.
        kw.setdefault("n_threads", 1)
        session = Session(SessionConfig(model=model, **kw))
        app = create_app(session, settings or ServerSettings())
        opened.append((app, session))
        return app

    yield _make
    for app, session in opened:
        close_app(app)
        session.close()


@pytest.fixture()
def live() -> Iterator[Callable[[FastAPI], LiveServer]]:
    servers: list[LiveServer] = []

    def _start(app: FastAPI) -> LiveServer:
        s = LiveServer(app).start()
        servers.append(s)
        return s

    yield _start
    for s in servers:
        s.stop()
