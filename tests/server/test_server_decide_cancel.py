"""A /v1/decide whose client leaves while it runs (#38.6), against a live uvicorn: the list stops,
the request is a 499 in the request counter and counts in bmoe_cancelled_total, as a chat turn
does, and the session answers the next decision."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from helpers.server import label_sets, metric

DECIDE = {"prefix": "Pick one.\n", "suffix": "A or B?", "choices": ["A", "B"]}


def test_a_decide_client_that_leaves_while_it_runs_is_counted(make_app, tiny_path, live) -> None:
    app = make_app(tiny_path)
    server = live(app)
    session = app.state.session
    real = session.decide_many
    started, waited = threading.Event(), []

    def held(requests, *, cancel=None):
        # The decisions start only once the client has gone, so the list is surely still running
        # when it leaves, however fast the machine: what the engine then does with a set event.
        started.set()
        waited.append(cancel is not None and cancel.wait(30))
        return real(requests, cancel=cancel)

    session.decide_many = held
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/decide", json=[DECIDE, DECIDE, DECIDE], timeout=1.0)
    assert started.is_set()
    deadline = time.monotonic() + 20
    while metric(httpx.get(server.url + "/metrics").text, "bmoe_cancelled_total") < 1:
        assert time.monotonic() < deadline, "the stopped decision list was not counted as cancelled"
        time.sleep(0.1)
    session.decide_many = real
    assert waited == [True]  # the server noticed the client left and set the job's event
    m = httpx.get(server.url + "/metrics").text
    assert metric(m, "bmoe_cancelled_total") == 1
    assert metric(m, "bmoe_http_requests_total", route="/v1/decide", status="499") == 1
    assert label_sets(m, "bmoe_decisions_total") == []  # the cancelled decisions are not answers
    r = httpx.post(server.url + "/v1/decide", json=DECIDE, timeout=60)
    assert r.status_code == 200 and r.json()["best"] in (0, 1)
    assert metric(httpx.get(server.url + "/metrics").text, "bmoe_cancelled_total") == 1
