"""Schemathesis against the app's own OpenAPI schema: generated requests (valid and not) never
get a 5xx, and the session still answers afterwards. Bounded: a few dozen examples per route on
the tiny MoE with a short context and few tokens per answer."""

from __future__ import annotations

import pytest
import schemathesis
import schemathesis.specs.openapi.schemas  # noqa: F401
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error  # noqa: E402

from bmoe.server import ServerSettings  # noqa: E402

# ``from_asgi`` imports schemathesis' OpenAPI modules on first use; imported here, at collection,
# they are compiled before any test runs. In CI they were first imported after a test of deeply
# nested JSON bodies in the same worker, and Python 3.11's AST constructor then failed with
# "recursion depth mismatch" (a CPython bug that bodies nested past the recursion limit trigger).


@pytest.fixture(scope="module")
def fuzz_app(tiny_path):
    from bmoe.config import SessionConfig
    from bmoe.server import close_app, create_app
    from bmoe.session import Session

    session = Session(SessionConfig(model=tiny_path, n_ctx=256, n_predict=3, decide=True, n_threads=1))
    # schemathesis' in-process client sends "Host: testserver", a name the server answers only when told.
    app = create_app(session, ServerSettings(max_body_bytes=16384, allowed_hosts=("testserver",)))
    yield app
    close_app(app)
    session.close()


def _with_messages(case, messages: list[dict]):
    if isinstance(case.body, dict):
        case.body = {**case.body, "messages": messages}
    return case


def test_no_server_errors(fuzz_app) -> None:
    # Driven by hand rather than through schemathesis' pytest plugin, which does not support this
    # pytest; every operation in the schema gets its own bounded hypothesis run.
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/decide", "/v1/models", "/health"}
    chat = next(op for op in operations if op.path == "/v1/chat/completions")
    # The chat body's message shapes (tool calls, tool results, images) are so many that fuzzed
    # conversations are nearly all refused before the session: one more run fuzzes every other
    # field of a conversation that is one user message.
    one_user = chat.as_strategy().map(lambda case: _with_messages(case, [{"role": "user", "content": "hi"}]))
    for strategy in [*(op.as_strategy() for op in operations), one_user]:

        @given(case=strategy)
        @settings(
            max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
        )
        def run(case) -> None:
            case.call_and_validate(checks=[not_a_server_error])

        run()
    # The runs reached the session, not only the validator.
    counted = fuzz_app.state.metrics.registry.get_sample_value
    for route in ("/v1/chat/completions", "/v1/decide"):
        assert counted("bmoe_http_requests_total", {"route": route, "status": "200"}), route
    statuses = {
        s.labels["status"]
        for m in fuzz_app.state.metrics.registry.collect()
        for s in m.samples
        if s.name == "bmoe_http_requests_total"
    }
    assert not any(st.startswith("5") for st in statuses), statuses
    print(sorted(statuses))


def test_the_session_answers_after_fuzzing(fuzz_app) -> None:
    with TestClient(fuzz_app, base_url="http://localhost") as c:
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        assert (
            c.post("/v1/decide", json={"prefix": "Q\n", "suffix": "A or B?", "choices": ["A", "B"]}).status_code == 200
        )
