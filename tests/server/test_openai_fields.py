"""The one table of OpenAI fields (server/openai_fields.py, #36.5): every field of the request
bodies and of the installed openai SDK has a row, docs/server.md shows the table, and every
refused field set to a value that asks for something is a 400 naming it, on the tiny MoE."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from bmoe.server.openai_fields import CHAT_FIELDS, COMPLETION_FIELDS, REFUSED, markdown_table
from bmoe.server.schemas import ChatCompletionRequest, CompletionRequest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "server.md"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
ASKING = {
    "n": 2,
    "best_of": 3,
    "stream": True,
    "json_schema": {"type": "object"},
}


@pytest.mark.parametrize("body, table", [(ChatCompletionRequest, CHAT_FIELDS), (CompletionRequest, COMPLETION_FIELDS)])
def test_every_body_field_has_one_row(body, table) -> None:
    names = [f.name for f in table]
    assert len(names) == len(set(names)), "a field has two rows"
    assert set(body.model_fields) == set(names), "add a row to server/openai_fields.py for each new field"


@pytest.mark.parametrize(
    "module, table",
    [
        ("openai.types.chat.completion_create_params", CHAT_FIELDS),
        ("openai.types.completion_create_params", COMPLETION_FIELDS),
    ],
)
def test_every_field_the_openai_sdk_sends_has_a_row(module, table) -> None:
    params = pytest.importorskip(module)
    sdk = set(params.CompletionCreateParamsBase.__annotations__)
    assert sdk - {f.name for f in table} == set()


@pytest.mark.parametrize("table", [CHAT_FIELDS, COMPLETION_FIELDS])
def test_docs_show_the_table(table) -> None:
    rendered = markdown_table(table)
    assert rendered in DOCS.read_text(), f"docs/server.md's table is not the code's; it is now:\n{rendered}"


@pytest.fixture()
def client(make_app, tiny_path):
    app = make_app(tiny_path, n_ctx=128)
    with TestClient(app, base_url="http://localhost") as c:
        yield c


@pytest.mark.parametrize("field", [f for f in CHAT_FIELDS if f.status == REFUSED], ids=lambda f: f.name)
def test_chat_refuses_each_refused_field_by_name(client, field) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, field.name: ASKING.get(field.name, ["x"])})
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert (e["param"], e["code"]) == (field.name, "unsupported_field")
    assert e["message"] == f"{field.name}: {field.why}"
    for neutral in field.neutral:  # a value that asks for nothing passes
        assert client.post("/v1/chat/completions", json={**CHAT, field.name: neutral}).status_code == 200


def test_ignored_fields_change_nothing(client) -> None:
    plain = client.post("/v1/chat/completions", json={**CHAT, "temperature": 0}).json()
    extra = {"user": "u1", "store": True, "metadata": {"a": "b"}, "service_tier": "auto", "prompt_cache_key": "k"}
    got = client.post("/v1/chat/completions", json={**CHAT, "temperature": 0, **extra}).json()
    assert got["choices"] == plain["choices"]


@pytest.mark.parametrize("field", [f for f in COMPLETION_FIELDS if f.status == REFUSED], ids=lambda f: f.name)
def test_completions_refuse_each_refused_field_by_name(client, field) -> None:
    r = client.post("/v1/completions", json={"prompt": "x", field.name: ASKING.get(field.name, "x")})
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert (e["param"], e["code"]) == (field.name, "unsupported_field")
    assert e["message"] == f"{field.name}: {field.why.format(value=ASKING.get(field.name, 'x'))}"
