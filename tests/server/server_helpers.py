"""Helpers for the server tests (a module of its own so test files can import it)."""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from bmoe.server.engine import Engine
from bmoe.session import Session


class LiveServer:
    """uvicorn serving ``app`` on 127.0.0.1 at a port the OS picked."""

    def __init__(self, app: FastAPI) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self, timeout: float = 15.0) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def hold_engine(engine: Engine, extra_waiting: int = 0) -> threading.Event:
    """Occupy the engine's worker until the returned event is set (and queue ``extra_waiting``
    no-op jobs behind it), so a test can fill the queue deterministically."""
    started, release = threading.Event(), threading.Event()

    def gate(session: Session, job: object) -> None:
        started.set()
        release.wait(30)

    async def submit_gate() -> None:
        engine.submit(gate)

    async def submit_extra() -> None:
        for _ in range(extra_waiting):
            engine.submit(lambda session, job: None)

    asyncio.run(submit_gate())
    assert started.wait(10)  # running, so the extra jobs wait behind it
    asyncio.run(submit_extra())
    return release


def metric(text: str, name: str) -> float:
    """The value of one sample line (exact name with labels) in Prometheus text, 0 if absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0
