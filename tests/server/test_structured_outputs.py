"""Structured outputs over the HTTP API (#36.1): response_format (json_object, json_schema with
strict), llama.cpp-server style json_schema and grammar, streamed and not, on SmolLM2 and a tiny
MoE; each refusal a 400 naming its field, the session answering the next request."""

from __future__ import annotations

import json

import jsonschema
import pytest
from fastapi.testclient import TestClient

from helpers.server import sse_events

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Give the capital of France and its population as JSON."}]


@pytest.fixture()
def client(make_app, smol_path):
    with TestClient(make_app(smol_path, n_predict=64), base_url="http://localhost") as c:
        yield c


def _answer(client, **fields) -> tuple[str, str]:
    r = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 64, **fields})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


def _valid(text: str, finish: str, schema: dict) -> None:
    if finish == "stop":
        jsonschema.validate(json.loads(text), schema)
    else:
        assert finish == "length"


@pytest.mark.parametrize(
    "fields,schema",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "c", "strict": True, "schema": CITY}}},
            CITY,
        ),
        ({"response_format": {"type": "json_object"}}, {"type": "object"}),
        ({"json_schema": {"enum": ["yes", "no", "unsure"]}}, {"enum": ["yes", "no", "unsure"]}),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "boolean"}}}},
            {"type": "boolean"},
        ),
    ],
)
def test_answers_validate(client, fields, schema) -> None:
    text, finish = _answer(client, **fields)
    _valid(text, finish, schema)


def test_grammar_and_text_format(client) -> None:
    text, finish = _answer(client, grammar='root ::= "yes" | "no"')
    assert text in ("yes", "no") and finish == "stop"
    _, finish = _answer(client, response_format={"type": "text"}, max_tokens=4)
    assert finish == "length"


def test_jump_forward_over_http_keeps_the_schema(client) -> None:
    """bmoe's jump_forward field reaches the generate loop: the answer validates, and it is the one
    the session's own generate gives with jump-forward (forced tokens split the grammar's way)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}
    text, finish = _answer(client, response_format=fmt, jump_forward=True, temperature=0)
    _valid(text, finish, CITY)
    from bmoe.session import GenerateRequest

    s = client.app.state.session
    want = s.generate(
        GenerateRequest(prompt=ASK[0]["content"], n_predict=64, temperature=0, json_schema=CITY, jump_forward=True)
    )
    assert text == want.text


def test_cut_answer_says_length(client) -> None:
    schema = {"type": "array", "items": {"type": "string", "minLength": 24}, "minItems": 1}  # no end in 3 tokens
    text, finish = _answer(client, json_schema=schema, max_tokens=3)
    assert finish == "length" and text.startswith("[")


def test_streamed_constrained_equals_the_whole_answer(client) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}
    whole, finish = _answer(client, response_format=fmt)
    r = client.post(
        "/v1/chat/completions", json={"messages": ASK, "max_tokens": 64, "response_format": fmt, "stream": True}
    )
    events = sse_events(r.text)
    chunks = [e for e in events if isinstance(e, dict)]
    assert events[-1] == "[DONE]"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == finish


UNIQUE = "keyword 'uniqueItems' at / is not supported (bmoe would not enforce it, so it refuses it)"
REFUSALS = [
    ({"json_schema": {"type": "array", "uniqueItems": True}}, "json_schema", f"json_schema: {UNIQUE}"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"uniqueItems": True}}}},
        "response_format.json_schema.schema",
        f"response_format.json_schema.schema: {UNIQUE}",
    ),
    (
        {"response_format": {"type": "yaml"}},
        "response_format.type",
        "response_format.type: must be 'text', 'json_object' or 'json_schema', got 'yaml'",
    ),
    (
        {"grammar": 'root ::= "yes'},
        "grammar",
        "grammar: does not parse as GBNF: Unexpected end of input at line 1, 'root ::= \"yes' ^ ''",
    ),
    ({"grammar": 'root ::= x\nx ::= x "a"'}, "grammar", "grammar: accepts no text at all (its root rule never ends)"),
    (
        {"json_schema": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}},
        "json_schema",
        "json_schema: recursive $ref '#/$defs/a' at /$defs/a (a schema that contains itself) is not supported",
    ),
    (
        {"json_schema": {"enum": list(range(10_000))}},
        "json_schema",
        "json_schema: enum at / has 10000 values, more than the 1024 one request may hold",
    ),
    (
        {"json_schema": True, "grammar": 'root ::= "a"'},
        "grammar",
        "grammar: give one of response_format, json_schema, grammar, guided_choice, structured_outputs, got ['json_schema', 'grammar']",
    ),
    (
        {"json_schema": CITY, "jump_forward": True, "logprobs": True},
        "jump_forward",
        "jump_forward: a forced token has no log-prob of its own; not with logprobs",
    ),
    (
        {"response_format": {"type": "json_object"}, "json_schema": True},
        "json_schema",
        "json_schema: give one of response_format, json_schema, grammar, guided_choice, structured_outputs, got ['response_format', 'json_schema']",
    ),
]


@pytest.mark.parametrize("fields,param,message", REFUSALS)
def test_refusal_names_the_field_and_the_session_goes_on(client, fields, param: str, message: str) -> None:
    r = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 8, **fields})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"] == message and err["param"] == param
    text, finish = _answer(client, json_schema={"enum": ["yes", "no"]})
    assert text in ('"yes"', '"no"') and finish == "stop"


def test_tiny_moe_streamed_constrained_answer(make_app, tiny_path) -> None:
    with TestClient(make_app(tiny_path, n_ctx=512), base_url="http://localhost") as c:
        body = {"messages": ASK, "max_tokens": 48, "json_schema": CITY}
        whole = c.post("/v1/chat/completions", json=body).json()["choices"][0]
        events = sse_events(c.post("/v1/chat/completions", json={**body, "stream": True}).text)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if isinstance(e, dict))
    assert text == whole["message"]["content"]
    _valid(text, whole["finish_reason"], CITY)


def test_openai_sdk_with_a_pydantic_model(make_app, smol_path, live) -> None:
    """README's example: the openai SDK's response_format from a Pydantic model, and its parse."""
    from openai import OpenAI
    from pydantic import BaseModel

    class Verdict(BaseModel):
        answer: bool
        confidence: int

    server = live(make_app(smol_path, n_predict=64))
    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    msgs = [{"role": "user", "content": "Is Paris in France? Give your confidence in percent."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "v", "strict": True, "schema": Verdict.model_json_schema()}}
    r = client.chat.completions.create(model="bmoe", max_tokens=64, messages=msgs, response_format=fmt)  # type: ignore[arg-type]
    assert r.choices[0].finish_reason == "stop"  # greedy (the session's temperature 0): it ends
    Verdict.model_validate_json(r.choices[0].message.content or "")
    parsed = client.chat.completions.parse(model="bmoe", max_tokens=64, messages=msgs, response_format=Verdict)  # type: ignore[arg-type]
    assert isinstance(parsed.choices[0].message.parsed, Verdict)
