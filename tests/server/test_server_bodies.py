"""Bodies that are not JSON at all, and the schema routes (#38, "Also"): each malformed body is one
400 ``invalid_json`` naming what was wrong, in bmoe's error shape; /openapi.json answers behind the
API key when one is set; /docs and /redoc, whose pages need a CDN, are not served."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from bmoe.server import ServerSettings
from helpers.server import metric

JSON = {"Content-Type": "application/json"}
OK_CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
OK_DECIDE = {"prefix": "Pick one.\n", "suffix": "A or B?", "choices": ["A", "B"]}


@pytest.fixture()
def client(make_app, tiny_path):
    with TestClient(make_app(tiny_path, n_ctx=128), base_url="http://localhost") as c:
        yield c


BAD_BODIES = [
    # bytes that are not UTF-8 inside a string
    (
        b'{"prefix": "\xff\xfe", "suffix": "A or B?", "choices": ["A", "B"]}',
        "body: not valid JSON: not UTF-8 text (byte 0xff at offset 12: invalid start byte)",
    ),
    # deeper than Python's parser goes
    (b"[" * 100_000 + b"]" * 100_000, "body: not valid JSON: its arrays and objects nest deeper than the parser goes"),
    # 5000 digits: more than Python turns into an int
    (
        b'{"id": ' + b"7" * 5000 + b', "choices": ["A", "B"]}',
        "body: not valid JSON: an integer of more than 4300 digits, more than Python reads",
    ),
    # plain bad syntax: the parser's own words and where
    (b'{"choices": [', "body: not valid JSON: Expecting value: line 1 column 14 (char 13)"),
]


@pytest.mark.parametrize("path", ["/v1/decide", "/v1/chat/completions", "/v1/completions", "/tokenize"])
@pytest.mark.parametrize("body, message", BAD_BODIES, ids=["utf8", "deep", "digits", "syntax"])
def test_a_body_that_is_not_json_is_one_clear_refusal(client, path, body, message) -> None:
    r = client.post(path, content=body, headers=JSON)
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": {"message": message, "type": "invalid_request_error", "param": "body", "code": "invalid_json"}
    }
    assert client.post("/v1/decide", json=OK_DECIDE).status_code == 200  # the server still answers


def test_malformed_bodies_do_not_reach_the_session(client) -> None:
    for body, _ in BAD_BODIES:
        client.post("/v1/decide", content=body, headers=JSON)
    m = client.get("/metrics").text
    assert metric(m, "bmoe_http_requests_total", route="/v1/decide", status="400") == len(BAD_BODIES)
    assert "bmoe_decisions_total{" not in m  # none ran
    assert client.post("/v1/chat/completions", json=OK_CHAT).status_code == 200


def test_unknown_paths_and_methods_have_a_code(client) -> None:
    r = client.get("/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"] == {
        "message": "Not Found",
        "type": "invalid_request_error",
        "param": None,
        "code": "not_found",
    }
    r = client.put("/v1/decide", json=OK_DECIDE)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/docs/oauth2-redirect"])
def test_no_schema_pages(client, path) -> None:
    """Their pages load scripts from a CDN (blank offline), so they are not served at all."""
    r = client.get(path)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_the_schema_without_a_key(client) -> None:
    r = client.get("/openapi.json")
    assert r.status_code == 200
    assert {"/v1/chat/completions", "/v1/decide", "/v1/completions", "/health"} <= set(r.json()["paths"])
    assert "/openapi.json" not in r.json()["paths"]
    assert metric(client.get("/metrics").text, "bmoe_http_requests_total", route="/openapi.json", status="200") == 1


def test_the_schema_needs_the_key_when_one_is_set(make_app, tiny_path) -> None:
    with TestClient(make_app(tiny_path, ServerSettings(api_key="sekret")), base_url="http://localhost") as c:
        r = c.get("/openapi.json")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert c.get("/openapi.json", headers={"Authorization": "Bearer wrong"}).status_code == 401
        r = c.get("/openapi.json", headers={"Authorization": "Bearer sekret"})
        assert r.status_code == 200 and "/v1/decide" in r.json()["paths"]
        assert c.get("/docs").status_code == 404
