"""Helpers for the server tests (a module of its own so test files can import it)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from bmoe.server.job_queue import JobQueue
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


def hold_queue(queue: JobQueue, extra_waiting: int = 0) -> threading.Event:
    """Occupy the job queue's worker until the returned event is set (and queue ``extra_waiting``
    no-op jobs behind it), so a test can fill the queue deterministically."""
    started, release = threading.Event(), threading.Event()

    def gate(session: Session, job: object) -> None:
        started.set()
        release.wait(30)

    async def submit_gate() -> None:
        queue.submit(gate)

    async def submit_extra() -> None:
        for _ in range(extra_waiting):
            queue.submit(lambda session, job: None)

    asyncio.run(submit_gate())
    assert started.wait(10)  # running, so the extra jobs wait behind it
    asyncio.run(submit_extra())
    return release


def _parse(text: str) -> tuple[set[str], list[tuple[str, dict[str, str], float]]]:
    """The sample names the text declares (its ``# TYPE`` lines) and every sample in it."""
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    found = [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]
    return declared, found


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the one sample ``name`` with exactly ``labels`` in Prometheus text.

    Fails the test when there is no such sample (a misspelled name, a labelled counter asked for
    without its labels, or a label set that has not been counted yet), naming the label sets that
    do exist, so an assert built on it can never pass by reading a default of 0."""
    if "{" in name:
        raise TypeError(f"metric(): give the labels as keywords, not in the name: {name!r}")
    _, found = _parse(text)
    for n, got, value in found:
        if n == name and got == labels:
            return value
    have = [got for n, got, _ in found if n == name]
    raise AssertionError(f"no sample {name}{labels or ''} in the metrics; that name has {have or 'no samples'}")


def label_sets(text: str, name: str) -> list[dict[str, str]]:
    """The label sets of every sample ``name`` in the text ([] when a labelled counter has counted
    nothing yet). Fails the test when the text does not declare ``name`` at all (a misspelling)."""
    declared, found = _parse(text)
    if name not in declared:
        raise AssertionError(f"the metrics declare no {name}")
    return [got for n, got, _ in found if n == name]


def sse_events(text: str) -> list[dict | str]:
    """The server-sent events of a response body: each data payload parsed, ``[DONE]`` as it is."""
    out: list[dict | str] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def openai_client(url: str, key: str = "none", timeout: float = 120):  # type: ignore[no-untyped-def]
    """The openai SDK's client of a live server at ``url``: no retries (a refusal shows at once)."""
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=timeout)
