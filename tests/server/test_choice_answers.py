"""Decisions behind the standard fields (#36 item 2): a constrained answer of a finite set is one
decision, and at temperature 0 its text is exactly constrained greedy generation's, over many
schemas (multi-token values sharing first tokens among them), on SmolLM2 and on a tiny MoE
streamed and resident; at temperature > 0 it is drawn from the choices, seeded; the answer
carries ``bmoe.decision`` and, asked, the chosen tokens' log-probs."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from bmoe.session import GenerateRequest
from helpers.server import sse_events

ASK = "Answer the question. Which city is the capital of the state of New York?"


def _obj(prop: dict, **const: str) -> dict:
    props = {"answer": prop, **{k: {"const": v} for k, v in const.items()}}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


# (request fields, the schema generate gets, or None for a grammar given as such)
CASES = [
    {"json_schema": {"enum": ["yes", "no", "unsure"]}},
    {"json_schema": {"enum": ["New York", "New Jersey", "New Mexico", "Albany"]}},
    {"json_schema": {"enum": ["Al", "Alb", "Albany", "Albuquerque"]}},
    {"json_schema": {"enum": [1, 10, 100, 1000]}},
    {"json_schema": {"enum": ["a", "ab", "abc", "b"]}},
    {"json_schema": {"type": "boolean"}},
    {"json_schema": {"const": "Albany"}},
    {"json_schema": _obj({"enum": ["Albany", "Buffalo", "New York City"]}, kind="city")},
    {"json_schema": _obj({"type": "boolean"})},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": {"enum": ["Alb", "Albany"]}}}},
    {"guided_choice": ["New York City", "New York", "Albany", "Buffalo"]},
    {"guided_choice": ["Albany", "Albany, NY", "Albania"]},
    {"structured_outputs": {"choice": ["yes", "yes, Albany", "no"]}},
    {"grammar": 'root ::= "Albany" | "Alb" | "New York"'},
]
TINY_CASES = [CASES[0], CASES[1], CASES[2], CASES[5], CASES[7], CASES[10], CASES[12]]


def _chat(client: TestClient, fields: dict, **more) -> dict:
    body = {"messages": [{"role": "user", "content": ASK}], "max_tokens": 48, **fields, **more}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _greedy(client: TestClient, fields: dict) -> str:
    """Constrained greedy generation's text for the same question, from a fresh KV."""
    from bmoe.constrain import choice_grammar

    schema = fields.get("json_schema")
    if "response_format" in fields:
        schema = fields["response_format"]["json_schema"]["schema"]
    grammar = fields.get("grammar")
    choice = choice_grammar(fields.get("guided_choice"), fields.get("structured_outputs"))
    if choice is not None:
        grammar = choice[1]
    s = client.app.state.session
    r = s.generate(
        GenerateRequest(prompt=ASK, n_predict=48, clear_kv=True, temperature=0.0, json_schema=schema, grammar=grammar)
    )
    assert r.stop == "eog"
    return r.text


def _check_greedy(client: TestClient, cases: list[dict], **more) -> dict[str, int]:
    paths = {"decision": 0, "greedy_walk": 0}
    for fields in cases:
        body = _chat(client, fields, temperature=0, **more)
        text = body["choices"][0]["message"]["content"]
        decision = body["bmoe"]["decision"]
        assert text in decision["choices"], (fields, text)
        assert decision["choices"][decision["chosen"]] == text
        paths[decision["answered_by"]] += 1
        assert text == _greedy(client, fields), (fields, decision)
    return paths


@pytest.fixture()
def smol(make_app, smol_path):
    with TestClient(make_app(smol_path, n_predict=64), base_url="http://localhost") as c:
        yield c


@pytest.mark.parametrize("logprobs", [False, True])
def test_temperature_0_is_constrained_greedy_on_smollm2(smol, logprobs) -> None:
    """Without logprobs every answer comes by the greedy walk; with them the decision runs, and
    answers where its scores show greedy's text."""
    paths = _check_greedy(smol, CASES, logprobs=logprobs)
    if not logprobs:
        assert paths == {"decision": 0, "greedy_walk": len(CASES)}


@pytest.mark.parametrize("streamed", [False, True])
def test_temperature_0_is_constrained_greedy_on_tiny_moe(make_app, tiny_path, streamed) -> None:
    kw = {"moe_stream": True, "cache_mb": "auto"} if streamed else {}
    with TestClient(make_app(tiny_path, n_predict=64, **kw), base_url="http://localhost") as c:
        _check_greedy(c, TINY_CASES)


def test_tiny_moe_streamed_equals_resident(make_app, tiny_path) -> None:
    """The decision's numbers themselves, streamed and resident, bit for bit."""
    got = []
    for kw in ({}, {"moe_stream": True, "cache_mb": "auto"}):
        with TestClient(make_app(tiny_path, n_predict=64, **kw), base_url="http://localhost") as c:
            got.append([_chat(c, f, temperature=0, logprobs=True)["bmoe"]["decision"] for f in TINY_CASES])
    assert all("choice_logp" in d for d in got[0])
    assert got[0] == got[1]


def test_walk_decodes_only_where_choices_share_tokens(smol) -> None:
    d = _chat(smol, {"guided_choice": ["Albany", "Buffalo"]}, temperature=0)["bmoe"]["decision"]
    assert d["answered_by"] == "greedy_walk" and d["decoded"] == 0 and "choice_logp" not in d


def test_a_decision_decodes_nothing(smol) -> None:
    body = _chat(smol, {"guided_choice": ["Albany", "Buffalo"]}, temperature=1.0, seed=1, logprobs=True)
    d = body["bmoe"]["decision"]
    assert d["answered_by"] == "decision" and set(d) >= {"choice_logp", "p_outside", "abstained"}
    assert body["bmoe"]["tokens"] == len(body["choices"][0]["logprobs"]["content"])
    entries = body["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in entries) == body["choices"][0]["message"]["content"]
    assert sum(e["logprob"] for e in entries) == pytest.approx(d["choice_logp"][d["chosen"]], abs=1e-4)
    # the next turn continues from the answer in the history
    msgs = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": body["choices"][0]["message"]["content"]},
        {"role": "user", "content": "Are you sure?"},
    ]
    r = smol.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 4})
    assert r.status_code == 200


def test_temperature_above_0_samples_the_choices_seeded(smol) -> None:
    fields = {"guided_choice": ["red", "green", "blue", "yellow"]}
    seen = set()
    for seed in range(12):
        a = _chat(smol, fields, temperature=5.0, seed=seed)
        b = _chat(smol, fields, temperature=5.0, seed=seed)
        assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
        assert a["bmoe"]["decision"]["answered_by"] == "decision"
        seen.add(a["choices"][0]["message"]["content"])
    assert seen <= set(fields["guided_choice"]) and len(seen) >= 2


def test_streamed_choice_comes_as_one_delta(smol) -> None:
    r = smol.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": ASK}],
            "guided_choice": ["yes", "no"],
            "stream": True,
            "temperature": 0.7,
        },
    )
    assert r.status_code == 200
    chunks = [e for e in sse_events(r.text) if isinstance(e, dict)]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text in ("yes", "no")
    assert chunks[-1]["bmoe"]["decision"]["answered_by"] == "decision"


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"guided_choice": []}, "guided_choice: must be a non-empty list of strings"),
        ({"guided_choice": ["a", 3]}, "guided_choice.1: must be a non-empty string, got 3"),
        ({"guided_choice": ["a", "a"]}, "guided_choice.1: repeats the value 'a'"),
        (
            {"guided_choice": [str(i) for i in range(1025)]},
            "guided_choice: has 1025 values, more than the 1024 one request may hold",
        ),
        ({"structured_outputs": {"regex": "a+"}}, "structured_outputs.regex: is not supported here"),
        ({"structured_outputs": ["a"]}, "structured_outputs: must be an object"),
        ({"guided_choice": ["a"], "json_schema": {"enum": ["a"]}}, "give one of response_format"),
    ],
)
def test_choice_refusals_name_the_field(smol, fields, message) -> None:
    r = smol.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **fields})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"]
    assert _chat(smol, {"guided_choice": ["yes", "no"]})["choices"][0]["message"]["content"] in ("yes", "no")


def test_a_turn_with_tools_in_its_prompt_is_generated(smol) -> None:
    """Tools (even with tool_choice none) are rendered into the prompt, which a decision's would
    not hold: such a turn goes the constrained-generation way, and reports no decision."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    body = _chat(smol, {"guided_choice": ["yes", "no"]}, tools=[tool], tool_choice="none", temperature=0)
    assert body["choices"][0]["message"]["content"] in ("yes", "no")
    assert "decision" not in body["bmoe"]
