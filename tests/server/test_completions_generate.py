"""POST /v1/completions as a generation route (#36 items 1, 2, 4): a raw prompt continued with no
chat template, streamed or not, constrained by grammar / json_schema / response_format, and a
finite answer (guided_choice, an enum) answered by a decision over the raw prompt, at temperature
0 exactly what constrained greedy generation writes. The openai SDK against a live server on
SmolLM2, and the tiny MoE streamed equal to resident. The scoring path (max_tokens 0/1) is
test_completions.py's and test_lm_eval_client.py's."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from bmoe.config import SessionConfig
from bmoe.constrain import choice_grammar
from bmoe.server import ServerSettings, close_app, create_app
from bmoe.session import GenerateRequest, Message, Session
from helpers.server import LiveServer, openai_client, sse_events

PROMPT = "Question: Which city is the capital of the state of New York?\nAnswer:"
TEXT = "The capital of France is"  # SmolLM2 goes on after it (after PROMPT it ends at once)
CASES = [
    {"guided_choice": ["Albany", "Buffalo", "New York City"]},
    {"guided_choice": ["New York City", "New York", "Albany", "Buffalo"]},
    {"guided_choice": ["Albany", "Albany, NY", "Albania"]},
    {"structured_outputs": {"choice": ["yes", "yes, Albany", "no"]}},
    {"json_schema": {"enum": ["Al", "Alb", "Albany", "Albuquerque"]}},
    {"json_schema": {"enum": [1, 10, 100, 1000]}},
    {"json_schema": {"type": "boolean"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": {"enum": ["Alb", "Albany"]}}}},
    {"grammar": 'root ::= " Albany" | " Alb" | " New York"'},
]
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


def _constraint(fields: dict) -> tuple[dict | bool | None, str | None]:
    schema = fields.get("json_schema")
    if "response_format" in fields:
        schema = fields["response_format"]["json_schema"]["schema"]
    choice = choice_grammar(fields.get("guided_choice"), fields.get("structured_outputs"))
    return schema, choice[1] if choice is not None else fields.get("grammar")


def raw_generate(session: Session, prompt: str, n_predict: int, sampling: dict | None = None, **fields: object):  # noqa: ANN201
    """The session's own raw-prompt generation (temperature 0): the reference the route must equal."""
    toks = session.model.tokenize(prompt, add_special=True, parse_special=True)
    schema, grammar = _constraint(fields)
    it = session.generate_iter(
        GenerateRequest(
            prompt="",
            n_predict=n_predict,
            clear_kv=False,
            temperature=0.0,
            json_schema=schema,
            grammar=grammar,
            **(sampling or {}),
        ),
        tokens=toks,
    )
    while True:
        try:
            next(it)
        except StopIteration as done:
            return done.value


def _complete(c: TestClient, prompt: str = PROMPT, **fields: object) -> dict:
    r = c.post("/v1/completions", json={"prompt": prompt, "temperature": 0, **fields})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture()
def smol(make_app, smol_path):
    with TestClient(make_app(smol_path, n_ctx=512, n_predict=64), base_url="http://localhost") as c:
        yield c


def test_generation_is_the_raw_prompt_continued_and_leaves_the_history(smol) -> None:
    session = smol.app.state.session
    history = [Message("user", "hi"), Message("assistant", "hello")]
    session.set_history(history)
    body = _complete(smol, TEXT, max_tokens=12)
    ref = raw_generate(session, TEXT, 12)
    assert body["choices"][0]["text"] == ref.text and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 12 == len(ref.tokens)
    assert body["usage"]["prompt_tokens"] == len(session.model.tokenize(TEXT, add_special=True, parse_special=True))
    assert session.history == history  # no template, no turn added
    # OpenAI's default max_tokens, 16, when left out
    assert _complete(smol, TEXT)["usage"]["completion_tokens"] == 16


def test_logit_bias_and_penalties_shape_the_generation(smol) -> None:
    session = smol.app.state.session
    tok = session.model.tokenize(" Rome", add_special=False, parse_special=False)
    assert len(tok) == 1
    forced = _complete(smol, TEXT, max_tokens=4, logit_bias={str(tok[0]): 100})["choices"][0]["text"]
    assert forced == " Rome" * 4  # every step picks the biased token
    for pen in ({"presence_penalty": 2.0}, {"frequency_penalty": 1.5}):
        got = _complete(smol, TEXT, max_tokens=16, **pen)["choices"][0]["text"]
        assert got == raw_generate(session, TEXT, 16, sampling=pen).text
    plain = _complete(smol, TEXT, max_tokens=16)["choices"][0]["text"]
    assert got != plain  # the penalty changed the answer (SmolLM2 repeats itself without it)


def test_legacy_logprobs_echo_and_stop(smol) -> None:
    body = _complete(smol, TEXT, max_tokens=8, logprobs=3, echo=True)
    c = body["choices"][0]
    lp = c["logprobs"]
    n_prompt = body["usage"]["prompt_tokens"]
    assert len(lp["tokens"]) == n_prompt + 8 and c["text"].startswith(TEXT)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for tok, off in zip(lp["tokens"], lp["text_offset"]):
        assert c["text"][off : off + len(tok)] == tok
    for j in range(n_prompt, n_prompt + 8):  # greedy: each generated token is its row's most likely
        top = lp["top_logprobs"][j]
        assert len(top) == 3 and lp["token_logprobs"][j] == max(top.values())
    # the prompt's log-probs are the scorer's, as max_tokens 0 gives them
    scored = _complete(smol, TEXT, max_tokens=0, logprobs=3, echo=True)["choices"][0]["logprobs"]
    assert scored["token_logprobs"] == lp["token_logprobs"][:n_prompt]
    # without echo the offsets count from the prompt's start, as OpenAI's do
    plain = _complete(smol, TEXT, max_tokens=8, logprobs=1)["choices"][0]
    assert plain["logprobs"]["text_offset"][0] == len(TEXT) and plain["text"] == c["text"][len(TEXT) :]
    # a stop string cuts the text before it, and the answer ends "stop"
    stop = plain["text"].strip()[:3]
    cut = _complete(smol, TEXT, max_tokens=8, stop=[stop])["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == plain["text"][: plain["text"].index(stop)]


@pytest.mark.parametrize("logprobs", [None, 0])
def test_temperature_0_choice_is_constrained_greedy(smol, logprobs) -> None:
    """Without logprobs every answer comes by the greedy walk; with logprobs 0 the decision runs
    over the raw prompt and answers where its scores show greedy's text."""
    paths = {"decision": 0, "greedy_walk": 0}
    for fields in CASES:
        body = _complete(smol, max_tokens=48, logprobs=logprobs, **fields)
        text = body["choices"][0]["text"]
        d = body["bmoe"]["prompts"][0]["decision"]
        assert d["choices"][d["chosen"]] == text and body["choices"][0]["finish_reason"] == "stop"
        paths[d["answered_by"]] += 1
        ref = raw_generate(smol.app.state.session, PROMPT, 48, **fields)
        assert ref.stop == "eog" and text == ref.text, (fields, d)
        # the same answer generated token by token (a stop string that never matches: no decision)
        generated = _complete(smol, max_tokens=48, stop=["@@@"], **fields)
        assert generated["choices"][0]["text"] == text and "decision" not in generated["bmoe"]["prompts"][0]
        if logprobs is not None:
            assert len(d["choice_logp"]) == len(d["choices"]) and 0.0 <= d["p_outside"] <= 1.0
            assert body["choices"][0]["logprobs"]["tokens"], d
    if logprobs is None:
        assert paths == {"decision": 0, "greedy_walk": len(CASES)}


def test_temperature_above_0_samples_the_choices_seeded(smol) -> None:
    choices = ["Albany", "Buffalo", "Rochester"]
    seen = set()
    for seed in range(8):
        a = _complete(smol, guided_choice=choices, temperature=10, seed=seed)
        b = _complete(smol, guided_choice=choices, temperature=10, seed=seed)
        assert a["choices"][0]["text"] == b["choices"][0]["text"] in choices
        d = a["bmoe"]["prompts"][0]["decision"]
        assert d["answered_by"] == "decision" and len(d["choice_logp"]) == 3 and "decoded" not in d
        seen.add(a["choices"][0]["text"])
    assert len(seen) >= 2  # drawn from the choices, not always the likeliest


def test_streamed_equals_whole(smol) -> None:
    for prompt, fields in (
        (TEXT, {"max_tokens": 10, "logprobs": 2}),
        (PROMPT, {"max_tokens": 48, "json_schema": CITY}),
        (PROMPT, CASES[1]),
    ):
        whole = _complete(smol, prompt, **fields)
        events = sse_events(
            smol.post("/v1/completions", json={"prompt": prompt, "temperature": 0, "stream": True, **fields}).text
        )
        assert events[-1] == "[DONE]"
        chunks = [e["choices"][0] for e in events if isinstance(e, dict) and e["choices"]]
        assert "".join(ch["text"] for ch in chunks) == whole["choices"][0]["text"]
        assert chunks[-1]["finish_reason"] == whole["choices"][0]["finish_reason"]
        if fields.get("logprobs") is not None:
            toks = [t for ch in chunks if ch["logprobs"] for t in ch["logprobs"]["tokens"]]
            assert toks == whole["choices"][0]["logprobs"]["tokens"]


def test_a_list_of_prompts_is_answered_in_turn(smol) -> None:
    body = _complete(smol, TEXT, max_tokens=6)
    prompts = [TEXT, PROMPT]
    r = smol.post("/v1/completions", json={"prompt": prompts, "temperature": 0, "max_tokens": 6, "stream": True})
    chunks = [e["choices"][0] for e in sse_events(r.text) if isinstance(e, dict) and e["choices"]]
    assert [ch["index"] for ch in chunks if ch["finish_reason"]] == [0, 1]
    texts = ["".join(ch["text"] for ch in chunks if ch["index"] == i) for i in (0, 1)]
    assert texts[0] == body["choices"][0]["text"]
    assert texts[1] == raw_generate(smol.app.state.session, prompts[1], 6).text == ""  # SmolLM2 ends at once


REFUSALS = [
    ({"n": 2}, "n", "n: only 1 is supported, got 2"),
    ({"best_of": 3}, "best_of", "best_of: only 1 is supported, got 3"),
    ({"suffix": "y"}, "suffix", "suffix: insertion (a suffix) is not supported"),
    (
        {"grammar": 'root ::= "yes'},
        "grammar",
        "grammar: does not parse as GBNF: Unexpected end of input at line 1, 'root ::= \"yes' ^ ''",
    ),
    ({"grammar": 'root ::= x\nx ::= x "a"'}, "grammar", "grammar: accepts no text at all (its root rule never ends)"),
    (
        {"json_schema": {"type": "array", "uniqueItems": True}},
        "json_schema",
        "json_schema: keyword 'uniqueItems' at / is not supported (bmoe would not enforce it, so it refuses it)",
    ),
    (
        {"json_schema": True, "grammar": 'root ::= "a"'},
        "grammar",
        "grammar: give one of response_format, json_schema, grammar, guided_choice, structured_outputs, "
        "got ['json_schema', 'grammar']",
    ),
    ({"guided_choice": []}, "guided_choice", "guided_choice: must be a non-empty list of strings"),
    (
        {"structured_outputs": {"regex": "a+"}},
        "structured_outputs.regex",
        "structured_outputs.regex: is not supported here (only 'choice'; use response_format for a schema, "
        "grammar for GBNF)",
    ),
    (
        {"json_schema": CITY, "jump_forward": True, "logprobs": 0},
        "jump_forward",
        "jump_forward: a forced token has no log-prob of its own; not with logprobs",
    ),
    (
        {"prompt": [7] * 500, "max_tokens": 20},
        "prompt",
        "prompt: 500 tokens, plus max_tokens (20), do not fit the context (n_ctx 512)",
    ),
]


@pytest.mark.parametrize("fields,param,message", REFUSALS)
def test_refusals_name_the_field_and_the_session_goes_on(smol, fields, param, message) -> None:
    kv = list(smol.app.state.session.kv.tokens)
    r = smol.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, **fields})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"] == message and err["param"] == param
    assert smol.app.state.session.kv.tokens == kv  # refused before any work
    assert _complete(smol, guided_choice=["yes", "no"])["choices"][0]["text"] in ("yes", "no")


@pytest.fixture(scope="module")
def live(smol_path):
    session = Session(SessionConfig(model=smol_path, n_ctx=1024, n_predict=64, decide=True, n_threads=1))
    app = create_app(session, ServerSettings())
    server = LiveServer(app).start()
    yield server, session
    server.stop()
    close_app(app)
    session.close()


def test_openai_sdk_completions(live) -> None:
    server, session = live
    client = openai_client(server.url)
    plain = client.completions.create(model="m", prompt=TEXT, max_tokens=10, temperature=0)
    assert plain.object == "text_completion" and plain.choices[0].finish_reason == "length"
    assert plain.choices[0].text == raw_generate(session, TEXT, 10).text
    stream = client.completions.create(model="m", prompt=TEXT, max_tokens=10, temperature=0, stream=True)
    assert "".join(ch.choices[0].text for ch in stream if ch.choices) == plain.choices[0].text
    g = client.completions.create(
        model="m", prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"grammar": 'root ::= [A-Z][a-z]+ "."'}
    )
    assert g.choices[0].text[0].isupper() and g.choices[0].text.endswith(".")
    js = client.completions.create(
        model="m", prompt=PROMPT, max_tokens=64, temperature=0, extra_body={"json_schema": CITY}
    ).choices[0]
    assert js.finish_reason == "stop" and set(json.loads(js.text)) == {"city", "population"}
    pick = client.completions.create(
        model="m", prompt=PROMPT, temperature=0, extra_body={"guided_choice": ["Albany", "Buffalo"]}
    )
    assert pick.choices[0].text in ("Albany", "Buffalo")
    assert pick.model_extra["bmoe"]["prompts"][0]["decision"]["answered_by"] == "greedy_walk"
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt=PROMPT, n=2)
    assert e.value.body["message"] == "n: only 1 is supported, got 2"


TINY = [
    {"max_tokens": 12, "logprobs": 2},
    {"max_tokens": 12, "logprobs": 1, "echo": True, "stop": ["zz"]},
    {"max_tokens": 24, "json_schema": CITY},
    {"guided_choice": ["Albany", "Buffalo", "New York City"], "logprobs": 0},
    {"guided_choice": ["Albany", "Buffalo", "New York City"]},
]


def test_tiny_moe_streamed_equals_resident(make_app, tiny_path) -> None:
    got = []
    for kw in ({}, {"moe_stream": True, "cache_mb": "auto"}):
        with TestClient(make_app(tiny_path, n_ctx=256, **kw), base_url="http://localhost") as c:
            answers = []
            for fields in TINY:
                body = _complete(c, **fields)
                sse = c.post("/v1/completions", json={"prompt": PROMPT, "temperature": 0, "stream": True, **fields})
                chunks = [e["choices"][0] for e in sse_events(sse.text) if isinstance(e, dict) and e["choices"]]
                assert "".join(ch["text"] for ch in chunks) == body["choices"][0]["text"]
                answers.append((body["choices"], body["usage"], body["bmoe"]["prompts"][0].get("decision")))
            got.append(answers)
    assert got[0] == got[1]


def test_a_client_that_leaves_mid_generation_stops_it_and_is_counted(smol) -> None:
    """The worker side: the job is cancelled (the client left) after the first token; the
    generation stops there, the job ends as Cancelled, the KV is rolled back to the reused prefix,
    and the cancel is counted."""
    from bmoe.server.completions_route import CompletionsRoute
    from bmoe.server.job_queue import STEP, Cancelled, Job
    from bmoe.server.schemas import CompletionRequest
    from helpers.server import metric

    app = smol.app
    session, metrics = app.state.session, app.state.metrics
    route = CompletionsRoute(app.state.queue, metrics, "m")
    fn = route._fn(CompletionRequest(prompt=TEXT, max_tokens=12, temperature=0), stream=True)
    job = object.__new__(Job)
    job.cancelled = __import__("threading").Event()
    pieces = []

    def emit(kind, value=None):  # noqa: ANN001, ANN202
        assert kind == STEP
        pieces.append(value)
        job.cancelled.set()

    job.emit = emit
    before = metrics.render().decode()
    with pytest.raises(Cancelled):
        fn(session, job)
    assert len(pieces) == 1 and pieces[0].text and pieces[0].finish_reason is None
    n_prompt = len(session.model.tokenize(TEXT, add_special=True, parse_special=True))
    assert len(session.kv.tokens) < n_prompt  # the turn never happened (kept: the reused prefix)
    text = metrics.render().decode()
    assert metric(text, "bmoe_cancelled_total") == metric(before, "bmoe_cancelled_total") + 1
    assert _complete(smol, TEXT, max_tokens=4)["choices"][0]["finish_reason"] == "length"


def test_jump_forward_echo_and_token_ids(smol) -> None:
    session = smol.app.state.session
    plain = _complete(smol, max_tokens=48, json_schema=CITY)
    jumped = _complete(smol, max_tokens=48, json_schema=CITY, jump_forward=True)
    assert jumped["choices"][0]["text"] == plain["choices"][0]["text"]
    assert jumped["choices"][0]["finish_reason"] == "stop"
    ids = session.model.tokenize(TEXT, add_special=True, parse_special=True)
    assert (
        _complete(smol, ids, max_tokens=8)["choices"][0]["text"]
        == _complete(smol, TEXT, max_tokens=8)["choices"][0]["text"]
    )
    echoed = _complete(smol, guided_choice=["Albany", "Buffalo"], echo=True)
    assert (
        echoed["choices"][0]["text"]
        == PROMPT + _complete(smol, guided_choice=["Albany", "Buffalo"])["choices"][0]["text"]
    )
    assert "decision" in echoed["bmoe"]["prompts"][0]
