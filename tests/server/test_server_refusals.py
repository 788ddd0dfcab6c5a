"""Every refusal: a 4xx JSON error that names the field, sent before any work, and the session
answering normally afterwards. On the tiny MoE (fast; refusals need no sensible text)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from bmoe.server import ServerSettings
from bmoe.session import DECIDE_OFF

OK_CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
OK_DECIDE = {"prefix": "Pick one.\n", "suffix": "A or B?", "choices": ["A", "B"]}


@pytest.fixture()
def client(make_app, tiny_path):
    app = make_app(tiny_path, ServerSettings(max_body_bytes=4096), n_ctx=128)
    with TestClient(app, base_url="http://localhost") as c:
        yield c


def err(r, status: int) -> dict:
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert e["message"] and e["type"]
    return e


def still_answers(c: TestClient) -> None:
    assert c.post("/v1/chat/completions", json=OK_CHAT).status_code == 200
    assert c.post("/v1/decide", json=OK_DECIDE).status_code == 200


@pytest.mark.parametrize(
    "body, param",
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        ({**OK_CHAT, "temperature": 11}, "temperature"),
        ({**OK_CHAT, "top_p": 0}, "top_p"),
        ({**OK_CHAT, "max_tokens": 0}, "max_tokens"),
        ({**OK_CHAT, "seed": -1}, "seed"),
        ({**OK_CHAT, "n": 2}, "n"),
        ({**OK_CHAT, "stop": 5}, "stop"),
        (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages.0.content"),  # a lone surrogate
    ],
)
def test_chat_schema_refusals_name_the_field(client, body, param) -> None:
    if isinstance(body, bytes):
        r = client.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    else:
        r = client.post("/v1/chat/completions", json=body)
    e = err(r, 422)
    assert e["param"].startswith(param)
    assert param.split(".")[0] in e["message"]


PARTS = [{"type": "text", "text": "x"}]


@pytest.mark.parametrize(
    "path, body, message",
    [
        # a list over its limit in a field that also takes a string: the limit, not "a valid string"
        ("/v1/chat/completions", {**OK_CHAT, "stop": ["x"] * 17}, "stop: at most 16 items, got 17"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": PARTS * 257}]},
            "messages.0.content: at most 256 items, got 257",
        ),
        ("/v1/chat/completions", {"messages": []}, "messages: at least 1 item, got 0"),
        ("/v1/decide", [{"choices": []}] * 257, "body: at most 256 items, got 257"),
        # ids that would not tell the answers apart (0, given or left out, may repeat: answers come in order)
        (
            "/v1/decide",
            [{"id": 3, "choices": ["A"]}, {"choices": ["A"]}, {"id": 0, "choices": ["A"]}, {"id": 3, "choices": ["B"]}],
            "body: id 3 is given to body.0 and body.3; give each request its own id (or none: those answer as id 0, in the "
            "order of the requests)",
        ),
        # a list of prompts over its limit: not "prompt.0: a valid integer" (a list of token ids may be longer)
        ("/v1/completions", {"prompt": ["x"] * 257, "max_tokens": 0}, "prompt: at most 256 items, got 257"),
        ("/v1/completions", {"prompt": [[1, 2]] * 257, "max_tokens": 0}, "prompt: at most 256 items, got 257"),
        ("/v1/completions", {"prompt": [1, "x"], "max_tokens": 0}, "prompt.1: Input should be a valid integer"),
        # JSON's NaN and Infinity (Python's json reads them): not a number in range, whatever the bound says
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
            "temperature: Input should be a finite number",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}',
            "top_p: Input should be a finite number",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "hi"}], "temperature": -Infinity}',
            "temperature: Input should be a finite number",
        ),
        ("/v1/decide", b'{"choices": ["A"], "abstain_below": NaN}', "abstain_below: Input should be a finite number"),
        # the item that is wrong, not the string the field could also have been
        ("/v1/chat/completions", {**OK_CHAT, "stop": ["x", 5]}, "stop.1: Input should be a valid string"),
    ],
)
def test_refusal_messages_say_the_rule(make_app, tiny_path, path, body, message) -> None:
    with TestClient(make_app(tiny_path), base_url="http://localhost") as c:
        if isinstance(body, bytes):
            r = c.post(path, content=body, headers={"Content-Type": "application/json"})
        else:
            r = c.post(path, json=body)
        assert err(r, 422)["message"] == message
        assert r.json()["detail"]  # FastAPI's own list is still there


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prefix": "x"}, "choices"),
        ({"choices": "A"}, "choices"),
        ({"choices": ["A"], "choise": 1}, "choise"),
        ({"choices": ["A"], "abstain_below": 1.5}, "abstain_below"),
        ({"choices": ["A"], "id": "1"}, "id"),
        ({"choices": ["A"], "reuse_prefix": "yes"}, "reuse_prefix"),
        ([], "body"),
        ([{"choices": ["A"]}, {"choices": 3}], "1.choices"),
    ],
)
def test_decide_schema_refusals_name_the_field(client, body, param) -> None:
    e = err(client.post("/v1/decide", json=body), 422)
    assert e["param"] == param


def test_semantic_refusals_are_400_and_change_nothing(client) -> None:
    session = client.app.state.session
    assert client.post("/v1/chat/completions", json=OK_CHAT).status_code == 200
    history = list(session.history)
    e = err(client.post("/v1/chat/completions", json={"messages": [{"role": "assistant", "content": "x"}]}), 400)
    assert e["param"] == "messages.0.role"
    long = {"messages": [{"role": "user", "content": "word " * 400}]}
    e = err(client.post("/v1/chat/completions", json=long), 400)
    assert e["param"] == "messages" and e["code"] == "context_length_exceeded"
    e = err(client.post("/v1/chat/completions", json={**OK_CHAT, "max_tokens": 500}), 400)
    assert e["param"] == "max_tokens"
    e = err(client.post("/v1/chat/completions", json={**OK_CHAT, "stream": True, "max_tokens": 500}), 400)
    assert e["param"] == "max_tokens"  # a streamed request is refused before the stream starts
    assert session.history == history  # nothing changed
    e = err(client.post("/v1/decide", json={"choices": ["A", "A"]}), 400)
    assert e["param"] == "choices" and "first token" in e["message"]
    e = err(client.post("/v1/decide", json={"choices": []}), 400)
    assert e["param"] == "choices"
    e = err(client.post("/v1/decide", json={"prefix": "word " * 400, "choices": ["A", "B"]}), 400)
    assert e["param"] == "prefix"
    still_answers(client)


def test_body_that_is_not_json(client) -> None:
    r = client.post("/v1/decide", content=b'{"choices": [', headers={"Content-Type": "application/json"})
    assert err(r, 400)["code"] == "invalid_json"  # test_server_bodies.py: every way a body is not JSON
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "text/json", None):
        headers = {"Content-Type": ctype} if ctype else {}
        r = client.post("/v1/decide", content=b'{"choices": ["A", "B"]}', headers=headers)
        assert err(r, 415)["code"] == "unsupported_media_type"  # a form post from another page does nothing
    assert err(client.post("/v1/nothing-here", json={}), 404)["message"]


def test_oversize_bodies_get_413(client) -> None:
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    assert err(client.post("/v1/chat/completions", json=big), 413)["code"] == "body_too_large"

    def chunks():  # no Content-Length: the limit still holds
        for _ in range(10):
            yield b"x" * 1000

    assert client.post("/v1/decide", content=chunks(), headers={"Content-Type": "application/json"}).status_code == 413
    still_answers(client)


def test_no_request_names_a_file(client) -> None:
    for path in (
        "/static/../app.py",
        "/static/..%2fapp.py",
        "/static/%2e%2e%2f%2e%2e%2fconfig.py",
        "/static/engine.py",
    ):
        assert client.get(path).status_code == 404
    r = client.post("/v1/chat/completions", json={**OK_CHAT, "model": "/etc/passwd"})
    assert r.status_code == 200 and r.json()["model"] == client.get("/v1/models").json()["data"][0]["id"]


def test_decide_off(make_app, tiny_path) -> None:
    with TestClient(make_app(tiny_path, decide=False), base_url="http://localhost") as c:
        e = err(c.post("/v1/decide", json=OK_DECIDE), 400)
        assert e["message"] == DECIDE_OFF
        assert c.post("/v1/chat/completions", json=OK_CHAT).status_code == 200


def test_auth_on(make_app, tiny_path) -> None:
    with TestClient(make_app(tiny_path, ServerSettings(api_key="sekret")), base_url="http://localhost") as c:
        for method, path, body in (
            ("post", "/v1/chat/completions", OK_CHAT),
            ("post", "/v1/decide", OK_DECIDE),
            ("get", "/v1/models", None),
            ("get", "/v1/session", None),
            ("get", "/metrics", None),
        ):
            r = c.request(method, path, json=body)
            assert err(r, 401)["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
            r = c.request(method, path, json=body, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401
            r = c.request(method, path, json=body, headers={"Authorization": "Bearer sekret"})
            assert r.status_code == 200, path
        assert c.get("/health").status_code == 200  # liveness needs no key
        assert c.get("/").status_code == 200  # the page holds no data; it asks for the key itself


def test_auth_off_needs_no_header(client) -> None:
    assert client.get("/v1/models").status_code == 200
    assert client.get("/metrics", headers={"Authorization": "Bearer anything"}).status_code == 200
