"""Constrained generation (#36.1): every answer the constraint ended parses and validates, a cut
one says "length", and a refused constraint leaves the session usable."""

from __future__ import annotations

import json

import jsonschema
import pytest

from bmoe.config import SessionConfig
from bmoe.constrain import ConstraintError
from bmoe.errors import RequestError
from bmoe.session import GenerateRequest, Session

SCHEMAS = [
    {"enum": ["yes", "no", "unsure"]},
    {"const": "fixed"},
    {"type": "boolean"},
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 1, "maxItems": 4},
    {
        "type": "object",
        "properties": {
            "label": {"enum": ["spam", "ham"]},
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "maxItems": 2},
            "inner": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}, "score": {"type": "number", "minimum": 0, "maximum": 1}},
                "required": ["ok"],
                "additionalProperties": False,
            },
        },
        "required": ["label", "inner"],
        "additionalProperties": False,
    },
    {"type": "string", "pattern": "^[A-Z][a-z]{2,8}$"},
    {"type": "integer", "minimum": 10, "maximum": 20},
    {"anyOf": [{"type": "null"}, {"type": "string", "enum": ["a b", "a c"]}]},
]
PROMPT = "Answer in JSON: which city is the capital of France, and how many people live there?"


def _check(result, schema) -> None:
    if result.stop == "length":
        return  # cut by n_predict: no promise
    assert result.stop == "eog", result
    jsonschema.validate(json.loads(result.text), schema)


@pytest.fixture(scope="module")
def smol() -> Session:
    from bmoe.testing import smollm2_gguf_path

    s = Session(SessionConfig(model=smollm2_gguf_path(), n_ctx=1024, n_threads=1))
    yield s
    s.close()


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_smollm2_answers_validate(smol: Session, i: int) -> None:
    schema = SCHEMAS[i]
    greedy = smol.generate(GenerateRequest(prompt=PROMPT, n_predict=64, json_schema=schema))
    sampled = smol.generate(GenerateRequest(prompt=PROMPT, n_predict=64, json_schema=schema, temperature=1.0, seed=i))
    _check(greedy, schema)
    _check(sampled, schema)
    assert greedy.stop == "eog" or i == 3  # all but the open-ended object finish within 64 tokens


def test_smollm2_grammar_and_cut_answer(smol: Session) -> None:
    r = smol.generate(GenerateRequest(prompt="Is the sky blue?", n_predict=8, grammar='root ::= "yes" | "no"'))
    assert r.text in ("yes", "no") and r.stop == "eog"
    cut = smol.generate(
        GenerateRequest(
            prompt=PROMPT, n_predict=3, json_schema={"type": "array", "items": {"type": "string"}, "minItems": 2}
        )
    )
    assert cut.stop == "length" and cut.n_tokens == 3


def test_refused_constraint_leaves_the_session_usable(smol: Session) -> None:
    with pytest.raises(ConstraintError) as e:
        smol.generate(GenerateRequest(prompt="hi", json_schema={"type": "array", "uniqueItems": True}))
    assert str(e.value) == (
        "json_schema: keyword 'uniqueItems' at / is not supported (bmoe would not enforce it, so it refuses it)"
    )
    with pytest.raises(ConstraintError, match="^grammar: accepts no text at all"):
        smol.generate(GenerateRequest(prompt="hi", grammar='root ::= x\nx ::= x "a"'))
    r = smol.generate(GenerateRequest(prompt="hi", n_predict=8, json_schema={"enum": ["hello", "bye"]}))
    assert r.text in ('"hello"', '"bye"') and r.stop == "eog"


@pytest.mark.parametrize("i", [0, 3, 5])
def test_tiny_moe_answers_validate_and_streamed_equals_resident(open_tiny, tmp_path, i: int) -> None:
    """The tiny MoE's random weights make odd but valid answers; streamed from its expert
    files (cache off) the constrained answer is the resident one, token for token and logit row
    for logit row."""
    import numpy as np

    schema = SCHEMAS[i]
    g = GenerateRequest(prompt=PROMPT, n_predict=48, json_schema=schema, keep_logits=True)
    resident = open_tiny("qwen3moe").generate(g)
    streamed = open_tiny("qwen3moe", moe_stream=True, cache_mb=0, twin_dir=tmp_path / "twins").generate(g)
    _check(resident, schema)
    assert streamed.tokens == resident.tokens and streamed.text == resident.text
    assert all(np.array_equal(a, b) for a, b in zip(streamed.logits, resident.logits, strict=True))


def test_line_protocol_generate_takes_json_schema_and_grammar(tiny_models) -> None:
    """The line protocol's generate carries the fields as the Python request does; a refused
    schema is one non-fatal BMOE_ERROR naming the keyword, and the next line is answered."""
    import io
    import threading

    from bmoe.cli.loop import run_session

    lines = [
        {"cmd": "generate", "id": 1, "prompt": "Hi", "n_predict": 32, "json_schema": {"enum": ["red", "green"]}},
        {"cmd": "generate", "id": 2, "prompt": "Hi", "json_schema": {"type": "array", "uniqueItems": True}},
        {"cmd": "generate", "id": 3, "prompt": "Hi", "n_predict": 8, "grammar": 'root ::= "ok" | "no"'},
        {"cmd": "generate", "id": 4, "prompt": "Hi", "json_schema": "not a schema"},
        {"cmd": "close"},
    ]
    stdin = io.TextIOWrapper(io.BytesIO("".join(json.dumps(x) + "\n" for x in lines).encode()), encoding="utf-8")
    out = io.StringIO()
    s = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=512, n_threads=1))
    try:
        t = threading.Thread(target=run_session, args=(s, stdin, out), daemon=True)
        t.start()
        t.join(120)
        assert not t.is_alive()
    finally:
        s.close()
    got = [(tag, json.loads(body)) for tag, _, body in (ln.partition(" ") for ln in out.getvalue().splitlines())]
    done = {b["id"]: b for tag, b in got if tag == "BMOE_DONE"}
    errs = {b["id"]: b for tag, b in got if tag == "BMOE_ERROR"}
    assert done[1]["text"] in ('"red"', '"green"') and done[1]["stop"] == "eog"
    assert done[3]["text"] in ("ok", "no") and done[3]["stop"] == "eog"
    assert errs[2] == {
        "id": 2,
        "fatal": False,
        "msg": "json_schema: keyword 'uniqueItems' at / is not supported (bmoe would not enforce it, so it refuses it)",
    }
    assert errs[4]["msg"] == (
        "generate: field 'json_schema' must be a JSON schema (an object, or true or false), got \"not a schema\""
    )


@pytest.mark.parametrize("i", [3, 5])
def test_jump_forward_batches_forced_tokens_and_keeps_the_constraint(smol: Session, i: int) -> None:
    """With jump_forward the forced tokens (keys, punctuation) go into the KV in fewer appends
    than tokens; the answer still validates, and it is the same JSON value as without."""
    schema = SCHEMAS[i]
    kv = smol.runtime.kv
    appends: list[list[int]] = []
    real = kv.append

    def counting(tokens, *a, **kw):
        appends.append(list(tokens))
        return real(tokens, *a, **kw)

    plain = smol.generate(GenerateRequest(prompt=PROMPT, n_predict=64, json_schema=schema))
    kv.append = counting  # type: ignore[method-assign]
    try:
        jumped = smol.generate(GenerateRequest(prompt=PROMPT, n_predict=64, json_schema=schema, jump_forward=True))
    finally:
        del kv.append
    _check(jumped, schema)
    decode = appends[1:]  # the first append is the prompt's prefill
    assert max(len(d) for d in decode) > 1 and len(decode) < jumped.n_tokens - 1
    # the answer's tokens went in once each, in order; not those at its very end (the last one, or
    # the run the constraint forced to finish it): nothing reads their logits
    fed = [t for d in decode for t in d]
    assert fed == list(jumped.tokens[: len(fed)]) and jumped.n_tokens - 3 <= len(fed) <= jumped.n_tokens
    if plain.stop == jumped.stop == "eog":
        assert json.loads(plain.text) == json.loads(jumped.text)


def test_jump_forward_is_refused_with_keep_logits(smol: Session) -> None:
    with pytest.raises(RequestError) as e:
        smol.generate(GenerateRequest(prompt="hi", json_schema=True, jump_forward=True, keep_logits=True))
    assert str(e.value) == "jump_forward: forced tokens have no logit row of their own; not with keep_logits"
