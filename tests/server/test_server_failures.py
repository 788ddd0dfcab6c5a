"""What an engine failure does to the server: a sticky one (the session raises it for every later
call: StreamFailedError, SessionClosedError) marks /health broken; any other error fails only the
request that met it, and /health stays ok."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from bmoe.errors import BmoeError, ConfigError, EngineFailure, ModelFileError, SessionClosedError, StreamFailedError
from bmoe.llama.context import ContextError

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def chat_through_a_failing_run(c: TestClient, monkeypatch, error: BaseException):
    """One chat request through the real session whose model run raises ``error`` (the patch is
    gone afterwards); the response."""

    def failing_run(turn, cancel):
        raise error
        yield  # a generator, as Runtime.run is

    with monkeypatch.context() as m:
        m.setattr(c.app.state.session.runtime, "run", failing_run)
        return c.post("/v1/chat/completions", json=CHAT)


def run_failing_job(app, error: BaseException) -> BaseException:
    """Run one job that raises ``error`` on the engine's worker; the error its request got back."""

    def fail(session, job):
        raise error

    async def run():
        ev = await app.state.queue.submit(fail).outcome()
        assert ev.kind == "error"
        return ev.value

    return asyncio.run(run())


@pytest.mark.parametrize(
    "error",
    [
        StreamFailedError("expert streaming failed: read error; open a new session"),
        SessionClosedError("the session is closed"),
    ],
    ids=type,
)
def test_a_sticky_error_marks_health_broken(make_app, tiny_path, error) -> None:
    app = make_app(tiny_path)
    with TestClient(app, base_url="http://localhost") as c:
        assert c.get("/health").json() == {"status": "ok", "queue": 0}
        assert run_failing_job(app, error) is error
        r = c.get("/health")
        assert r.status_code == 503
        assert r.json() == {"status": "error", "error": str(error), "queue": 0}


@pytest.mark.parametrize(
    "error",
    [
        ContextError("llama_decode failed with code 1 at position 0"),
        BmoeError("a one-off failure"),
        EngineFailure("an expert read failed"),
        ConfigError("a bad setting"),
        ModelFileError("a bad file"),
        RuntimeError("a bug"),
    ],
    ids=type,
)
def test_any_other_error_fails_only_its_request(make_app, tiny_path, error) -> None:
    app = make_app(tiny_path)
    with TestClient(app, base_url="http://localhost") as c:
        assert run_failing_job(app, error) is error  # the request that met it gets it back
        assert c.get("/health").json() == {"status": "ok", "queue": 0}
        assert app.state.queue.broken is None
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_a_failed_llama_decode_answers_500_and_the_server_stays_ok(make_app, tiny_path, monkeypatch) -> None:
    """Through the real session: a ContextError out of the model run is a plain BmoeError, not the
    session's sticky error, so the next request is served."""
    with TestClient(make_app(tiny_path), base_url="http://localhost") as c:
        r = chat_through_a_failing_run(c, monkeypatch, ContextError("llama_decode failed with code 1 at position 0"))
        assert r.status_code == 500, r.text
        e = r.json()["error"]
        assert e["code"] == "engine_error" and "ContextError: llama_decode failed" in e["message"]
        assert c.get("/health").json() == {"status": "ok", "queue": 0}
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_a_streaming_failure_breaks_the_session_and_health_says_so(make_app, tiny_path, monkeypatch) -> None:
    """Through the real session: an EngineFailure becomes its sticky StreamFailedError, which every
    later request meets too, so /health answers 503 with it (a supervisor restarts the server)."""
    with TestClient(make_app(tiny_path), base_url="http://localhost") as c:
        r = chat_through_a_failing_run(c, monkeypatch, EngineFailure("expert read failed: EIO"))
        assert r.status_code == 500, r.text
        assert "StreamFailedError: expert streaming failed: expert read failed: EIO" in r.json()["error"]["message"]
        h = c.get("/health")
        assert h.status_code == 503
        body = h.json()
        assert body["status"] == "error" and body["error"].startswith("expert streaming failed: expert read failed")
        again = c.post("/v1/chat/completions", json=CHAT)  # sticky: the patch is gone, the failure is not
        assert again.status_code == 500 and "StreamFailedError" in again.json()["error"]["message"]
        assert c.get("/health").status_code == 503
