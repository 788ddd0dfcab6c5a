"""The one-session queue: in order, bounded (503 + Retry-After), and a dropped waiter frees its slot."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from bmoe.server import ServerSettings
from helpers.server import hold_queue, label_sets, metric

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
DECIDE = {"prefix": "Pick.\n", "suffix": "A or B?", "choices": ["A", "B"]}


def test_requests_beyond_the_queue_get_503_with_retry_after(make_app, tiny_path) -> None:
    app = make_app(tiny_path, ServerSettings(max_queue=1))
    queue = app.state.queue
    with TestClient(app, base_url="http://localhost") as c:
        release = hold_queue(queue, extra_waiting=1)  # one running, one waiting: the queue is full
        try:
            for path, body in (
                ("/v1/chat/completions", CHAT),
                ("/v1/decide", DECIDE),
                ("/v1/chat/completions", {**CHAT, "stream": True}),
            ):
                r = c.post(path, json=body)
                assert r.status_code == 503, r.text
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["code"] == "queue_full"
            assert c.get("/health").json() == {"status": "ok", "queue": 2}
            assert metric(c.get("/metrics").text, "bmoe_queue_rejected_total") == 3
        finally:
            release.set()
        deadline = time.monotonic() + 30  # the held job and the waiting one finish first
        while queue.depth() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200  # the session still answers


def test_max_queue_zero_serves_one_at_a_time(make_app, tiny_path) -> None:
    app = make_app(tiny_path, ServerSettings(max_queue=0))
    with TestClient(app, base_url="http://localhost") as c:
        assert c.post("/v1/decide", json=DECIDE).status_code == 200  # idle: admitted
        release = hold_queue(app.state.queue)
        try:
            assert c.post("/v1/decide", json=DECIDE).status_code == 503
        finally:
            release.set()


def test_jobs_run_in_arrival_order_and_a_cancelled_waiter_is_dropped(make_app, tiny_path) -> None:
    queue = make_app(tiny_path, ServerSettings(max_queue=4)).state.queue
    ran: list[int] = []
    release = hold_queue(queue)

    async def scenario() -> list[str]:
        jobs = [queue.submit(lambda s, j, i=i: ran.append(i)) for i in range(4)]
        jobs[2].cancel()  # its client left while it waited
        release.set()
        return [(await j.outcome()).kind for j in jobs]

    kinds = asyncio.run(scenario())
    assert kinds == ["result", "result", "error", "result"]
    assert ran == [0, 1, 3]


def test_a_dropped_waiter_counts_as_cancelled(make_app, tiny_path) -> None:
    app = make_app(tiny_path, ServerSettings(max_queue=4))
    queue = app.state.queue
    release = hold_queue(queue)

    async def scenario() -> None:
        job = queue.submit(lambda s, j: None)
        job.cancel()  # its client left while it waited
        job.cancel()  # a second cancel of the same job counts nothing more
        assert (await job.outcome()).kind == "error"

    try:
        asyncio.run(scenario())
    finally:
        release.set()
    assert metric(app.state.metrics.render().decode(), "bmoe_cancelled_total") == 1


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", CHAT), ("/v1/decide", DECIDE)])
def test_a_client_that_leaves_while_queued_is_dropped_and_counted(make_app, tiny_path, live, path, body) -> None:
    app = make_app(tiny_path, ServerSettings(max_queue=4))
    server = live(app)
    release = hold_queue(app.state.queue)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + path, json=body, timeout=0.5)  # waits behind the held job, then gives up
        deadline = time.monotonic() + 10
        while app.state.queue.depth() > 1:  # the server notices the client left and drops its request
            assert time.monotonic() < deadline, "the queued request was not dropped"
            time.sleep(0.05)
    finally:
        release.set()
    m = httpx.get(server.url + "/metrics").text
    assert metric(m, "bmoe_cancelled_total") == 1
    assert label_sets(m, "bmoe_chat_completions_total") == label_sets(m, "bmoe_decisions_total") == []  # it never ran


def test_a_cancelled_waiter_frees_its_slot(make_app, tiny_path) -> None:
    queue = make_app(tiny_path, ServerSettings(max_queue=1)).state.queue
    release = hold_queue(queue)
    done = threading.Event()

    async def scenario() -> None:
        waiting = queue.submit(lambda s, j: None)
        waiting.cancel()
        queue.submit(lambda s, j: done.set())  # admitted: the slot is free again

    try:
        asyncio.run(scenario())
    finally:
        release.set()
    assert done.wait(10)


def test_a_chat_client_that_leaves_as_its_turn_starts_is_counted(make_app, tiny_path) -> None:
    """The worker side of a chat turn whose client left after the queue handed it over but before
    it generated: it ends as a 499 for nobody, and counts in bmoe_cancelled_total."""
    from bmoe.server.chat_route import ChatRoute, to_turn
    from bmoe.server.errors import ApiError
    from bmoe.server.job_queue import Job
    from bmoe.server.schemas import ChatCompletionRequest

    app = make_app(tiny_path, ServerSettings())
    route = ChatRoute(app.state.queue, app.state.metrics, "m")
    fn = route._worker_fn(to_turn(ChatCompletionRequest(model="m", **CHAT)))
    job = object.__new__(Job)
    job.cancelled = threading.Event()
    job.cancelled.set()
    before = metric(app.state.metrics.render().decode(), "bmoe_cancelled_total")
    with pytest.raises(ApiError) as e:
        fn(app.state.session, job)
    assert e.value.status == 499
    assert metric(app.state.metrics.render().decode(), "bmoe_cancelled_total") == before + 1


def test_a_decide_client_that_leaves_is_counted(make_app, tiny_path) -> None:
    """The worker side of a /v1/decide whose client left: the list stops and the request counts in
    bmoe_cancelled_total, as a chat turn does (it was only a 499 in the request counter)."""
    from bmoe import DecideRequest
    from bmoe.server.decide_route import DecideRoute
    from bmoe.server.errors import ApiError
    from bmoe.server.job_queue import Job

    app = make_app(tiny_path, ServerSettings(), decide=True)
    route = DecideRoute(app.state.queue, app.state.metrics)
    fn = route._fn([DecideRequest(id=i, prefix="Pick one. ", suffix="A or B?", choices=("A", "B")) for i in range(3)])
    job = object.__new__(Job)
    job.cancelled = threading.Event()
    job.cancelled.set()
    before = metric(app.state.metrics.render().decode(), "bmoe_cancelled_total")
    with pytest.raises(Exception) as e:
        fn(app.state.session, job)
    assert not isinstance(e.value, ApiError)  # Cancelled: run_job turns it into the 499
    assert type(e.value).__name__ == "Cancelled"
    assert metric(app.state.metrics.render().decode(), "bmoe_cancelled_total") == before + 1
