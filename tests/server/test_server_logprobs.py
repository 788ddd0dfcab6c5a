"""Log-probs on /v1/chat/completions (OpenAI's shape, streamed and not), logit_bias on both
completion routes, and bmoe_logprobs_of (a decision's full-vocabulary choice log-probs), on
SmolLM2 (docs/server.md "Log-probs")."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bmoe.session import DecideRequest, GenerateRequest, Message, ScoreRequest
from helpers.server import openai_client

MSGS = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
CHAT = {"messages": MSGS, "max_tokens": 6, "temperature": 0}


@pytest.fixture()
def app(make_app, smol_path):
    return make_app(smol_path, n_ctx=512, flash_attn=False)


@pytest.fixture()
def client(app):
    with TestClient(app, base_url="http://localhost") as c:
        yield c


def chat(c: TestClient, **extra) -> dict:
    r = c.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def streamed(c: TestClient, **extra) -> list[dict]:
    with c.stream("POST", "/v1/chat/completions", json={**CHAT, **extra, "stream": True}) as r:
        assert r.status_code == 200
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_logprobs_in_openais_shape_and_the_models_distribution(client, app) -> None:
    a = chat(client, logprobs=True, top_logprobs=3)
    lp = a["choices"][0]["logprobs"]
    assert set(lp) == {"content", "refusal"}
    content = lp["content"]
    assert len(content) == a["usage"]["completion_tokens"]
    assert "".join(e["token"] for e in content) == a["choices"][0]["message"]["content"]
    for e in content:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}
        assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]
        assert len(e["top_logprobs"]) == 3
        assert all(set(t) == {"token", "logprob", "bytes"} for t in e["top_logprobs"])
        vals = [t["logprob"] for t in e["top_logprobs"]]
        assert vals == sorted(vals, reverse=True) and sum(math.exp(v) for v in vals) <= 1.0 + 1e-9
        # greedy: the chosen token is the most likely one, with the very same number
        assert e["top_logprobs"][0]["token"] == e["token"] and e["top_logprobs"][0]["logprob"] == e["logprob"]
    # The same numbers as the session's own distribution after the same prompt
    s = app.state.session
    prompt = s.tokenize_prompt(s.render([Message("user", MSGS[0]["content"])], think=False))
    row = s.next_token_logprobs(prompt)
    first = content[0]
    tok = s.model.tokenize(first["token"], add_special=False, parse_special=False)
    assert len(tok) == 1 and math.isclose(first["logprob"], float(row[tok[0]]), abs_tol=1e-4)


def test_no_logprobs_unless_asked_and_zero_alternatives(client) -> None:
    assert chat(client)["choices"][0]["logprobs"] is None
    assert chat(client, top_logprobs=0)["choices"][0]["logprobs"] is None  # 0 without logprobs asks for nothing
    content = chat(client, logprobs=True)["choices"][0]["logprobs"]["content"]
    assert content and all(e["top_logprobs"] == [] for e in content)
    content = chat(client, logprobs=True, top_logprobs=20)["choices"][0]["logprobs"]["content"]
    assert all(len(e["top_logprobs"]) == 20 for e in content)


@pytest.mark.parametrize(
    "extra, status, param, message",
    [
        (
            {"logprobs": True, "top_logprobs": 21},
            422,
            "top_logprobs",
            "top_logprobs: Input should be less than or equal to 20",
        ),
        ({"logprobs": True, "top_logprobs": -1}, 422, "top_logprobs", None),
        ({"top_logprobs": 2}, 400, "top_logprobs", "top_logprobs: needs logprobs: true"),
        (
            {"logit_bias": {"49152": -100}},
            400,
            "logit_bias",
            "logit_bias: 49152 is not a token id of this model (0..49151)",
        ),
        ({"logit_bias": {"x": 1}}, 422, "logit_bias", None),
        ({"logit_bias": {"5": -101}}, 422, "logit_bias.5", None),
        ({"bmoe_logprobs_of": []}, 422, "bmoe_logprobs_of", None),
    ],
)
def test_refusals_name_the_field(client, app, extra, status, param, message) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert e["param"].startswith(param) and (message is None or e["message"] == message), e
    assert chat(client)["choices"][0]["message"]["content"]  # the session goes on


def test_streamed_logprobs_equal_the_non_streamed(client) -> None:
    chat(client, logprobs=True, top_logprobs=2)  # a warm-up: both compared answers reuse the prompt's KV
    whole = chat(client, logprobs=True, top_logprobs=2)["choices"][0]["logprobs"]["content"]
    chunks = streamed(client, logprobs=True, top_logprobs=2)
    got = [e for c in chunks for ch in c["choices"] if ch["logprobs"] for e in ch["logprobs"]["content"]]
    assert got == whole
    text = "".join(ch["delta"].get("content", "") for c in chunks for ch in c["choices"])
    assert "".join(e["token"] for e in got) == text
    assert all(ch["logprobs"] is None for c in streamed(client) for ch in c["choices"])
    last = streamed(client, bmoe_logprobs_of=["No", "Yes"])[-1]
    assert last["choices"][0]["finish_reason"] and [o["text"] for o in last["bmoe"]["logprobs_of"]] == ["No", "Yes"]


def test_logit_bias_minus_100_bans_the_greedy_token(client, app) -> None:
    first = chat(client, logprobs=True)["choices"][0]["logprobs"]["content"][0]
    tok = app.state.session.model.tokenize(first["token"], add_special=False, parse_special=False)
    assert len(tok) == 1
    banned = chat(client, logprobs=True, logit_bias={str(tok[0]): -100})
    b_first = banned["choices"][0]["logprobs"]["content"][0]
    assert b_first["token"] != first["token"]
    # and +100 on another token makes it the answer's first
    forced = chat(client, logprobs=True, logit_bias={str(tok[0]): -100, "28": 100})
    assert forced["choices"][0]["logprobs"]["content"][0]["bytes"] == list(
        app.state.session.model.token_bytes(28, special=True)
    )


def test_logit_bias_on_completions(client, app) -> None:
    r = client.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 1}).json()
    toks = app.state.session.model.tokenize(r["choices"][0]["text"], add_special=False, parse_special=False)
    r2 = client.post(
        "/v1/completions",
        json={"prompt": "The capital of France is", "max_tokens": 1, "logit_bias": {str(toks[0]): -100}},
    ).json()
    assert r2["choices"][0]["text"] != r["choices"][0]["text"]


def test_logprobs_of_is_the_decisions_and_agrees_with_the_answers(client, app) -> None:
    a = chat(client, logprobs=True, top_logprobs=5, bmoe_logprobs_of=["Yes", "No", "Maybe not"])
    of = a["bmoe"]["logprobs_of"]
    assert [o["text"] for o in of] == ["Yes", "No", "Maybe not"]
    s = app.state.session
    n = [len(s.model.tokenize(t, add_special=False, parse_special=False)) for t in ("Yes", "No", "Maybe not")]
    assert [o["n_tokens"] for o in of] == n and n[2] > 1
    # a one-token string's log-prob is the answer's first position's, as top_logprobs report it
    first = a["choices"][0]["logprobs"]["content"][0]
    top = {t["token"]: t["logprob"] for t in first["top_logprobs"]}
    for o in of[:2]:
        if o["text"] in top:
            assert math.isclose(o["logprob"], top[o["text"]], abs_tol=0.05), (o, top)
    assert of[2]["logprob"] < 0 and all(o["logprob"] <= 0 for o in of)


def test_logprobs_of_a_conversation(client, app) -> None:
    """The decision reads the whole conversation, as the answer does: a one-token string's
    log-prob is the answer's first position's."""
    msgs = [
        {"role": "system", "content": "You answer with one word."},
        {"role": "user", "content": "Is fire cold?"},
        {"role": "assistant", "content": "No."},
        *MSGS,
    ]
    a = chat(client, messages=msgs, logprobs=True, top_logprobs=20, bmoe_logprobs_of=["No", "Yes", "Maybe"])
    top = {t["token"]: t["logprob"] for t in a["choices"][0]["logprobs"]["content"][0]["top_logprobs"]}
    of = {o["text"]: o["logprob"] for o in a["bmoe"]["logprobs_of"]}
    shared = [t for t in of if t in top]
    assert shared, (of, top)
    for t in shared:  # other pieces (the answer's last prompt token is decoded alone): not bit for bit
        assert math.isclose(of[t], top[t], abs_tol=0.05), (t, of, top)
    # and exactly what the session's decision over the same conversation answers
    history = tuple((m["role"], m["content"]) for m in msgs[:-1])
    d = app.state.session.decide(
        DecideRequest(id=0, prefix="", suffix=MSGS[0]["content"], choices=tuple(of), scoring="full", history=history)
    )
    assert list(d.scores.choice_logp) == list(of.values())
    # a different conversation gives different numbers: the history is read
    b = chat(client, bmoe_logprobs_of=["No", "Yes", "Maybe"])["bmoe"]["logprobs_of"]
    assert [o["logprob"] for o in b] != list(of.values())


def test_session_generate_carries_logprobs(app) -> None:
    s = app.state.session
    steps = []
    r = s.generate(GenerateRequest(prompt="Hi", n_predict=4, temperature=0, top_logprobs=2), steps.append)
    lps = [st.logprobs for st in steps if st.token >= 0]
    assert len(lps) == r.n_tokens and all(lp is not None and len(lp.top_ids) == 2 for lp in lps)
    assert [lp.top_ids[0] for lp in lps] == list(r.tokens)


def test_every_position_agrees_with_the_sessions_scores(client, app) -> None:
    """The answer's log-probs, position by position, are what scoring the prompt and the answer
    gives (prefilled in one batch there, decoded one by one here: equal to float rounding)."""
    a = chat(client, logprobs=True, max_tokens=8)
    content = a["choices"][0]["logprobs"]["content"]
    s = app.state.session
    prompt = s.tokenize_prompt(s.render([Message("user", MSGS[0]["content"])], think=False))
    gen = [s.model.tokenize(e["token"], add_special=False, parse_special=False) for e in content]
    assert all(len(g) == 1 for g in gen)
    r = s.score(ScoreRequest(tokens=tuple(prompt + [g[0] for g in gen]), echo=True, reuse=False))
    want = [float(x) for x in r.token_logprobs[len(prompt) :]]
    assert [e["logprob"] for e in content] == pytest.approx(want, abs=2e-3)
    assert sum(e["logprob"] for e in content) == pytest.approx(sum(want), abs=1e-2)


def test_the_openai_sdk_reads_the_logprobs(make_app, smol_path, live) -> None:
    import openai

    server = live(make_app(smol_path, n_ctx=512))
    oa = openai_client(server.url, timeout=60)
    oa.chat.completions.create(model="smol", messages=MSGS, max_tokens=1)  # a warm-up: both answers below reuse the KV
    r = oa.chat.completions.create(
        model="smol", messages=MSGS, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3, logit_bias={"28": 0}
    )
    first = r.choices[0].logprobs.content[0]
    assert len(first.top_logprobs) == 3 and first.top_logprobs[0].token == first.token
    assert first.top_logprobs[0].logprob == first.logprob < 0 and bytes(first.bytes).decode() == first.token
    stream = oa.chat.completions.create(
        model="smol", messages=MSGS, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3, stream=True
    )
    got = [e for c in stream for ch in c.choices if ch.logprobs and ch.logprobs.content for e in ch.logprobs.content]
    assert [(e.token, e.logprob) for e in got] == [(e.token, e.logprob) for e in r.choices[0].logprobs.content]
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="smol", messages=MSGS, reasoning_effort="low")
    assert e.value.body["param"] == "reasoning_effort"


def test_session_refuses_a_bad_bias_and_goes_on(app) -> None:
    from bmoe.errors import RequestError

    s = app.state.session
    with pytest.raises(RequestError, match=r"^logit_bias: 49152 is not a token id of this model \(0\.\.49151\)$"):
        s.generate(GenerateRequest(prompt="Hi", n_predict=1, logit_bias=((49152, 1.0),)))
    with pytest.raises(RequestError, match=r"^top_logprobs: 21 is not in 0\.\.20$"):
        s.generate(GenerateRequest(prompt="Hi", n_predict=1, top_logprobs=21))
    assert s.generate(GenerateRequest(prompt="Hi", n_predict=1)).n_tokens == 1


def test_a_stop_string_keeps_the_tokens_up_to_the_match(client) -> None:
    """The entries run to the token that completed the stop string (its text, cut there, can be
    shorter); streamed, the chunks' entries joined are the same list."""
    whole = chat(client, logprobs=True, max_tokens=12)
    text = whole["choices"][0]["message"]["content"]
    stop = text[len(text) // 2 :][:2]
    assert stop.strip(), text
    cut = chat(client, logprobs=True, max_tokens=12, stop=[stop])
    assert cut["choices"][0]["finish_reason"] == "stop"
    content = cut["choices"][0]["logprobs"]["content"]
    joined = "".join(e["token"] for e in content)
    assert joined.startswith(cut["choices"][0]["message"]["content"]) and stop in joined
    assert stop not in "".join(e["token"] for e in content[:-1])  # the last one completed it
    chunks = streamed(client, logprobs=True, max_tokens=12, stop=[stop])
    got = [e for c in chunks for ch in c["choices"] if ch["logprobs"] for e in ch["logprobs"]["content"]]
    assert [e["token"] for e in got] == [e["token"] for e in content]


def test_penalties_are_openais_over_the_answers_tokens(app) -> None:
    """Each greedy token of a penalized answer is the argmax of the model's row less OpenAI's
    penalties over the answer's earlier tokens (the rows kept by the same run)."""
    s = app.state.session
    req = dict(prompt="Count: one one one one", n_predict=12, temperature=0, keep_logits=True)
    plain = s.generate(GenerateRequest(**req))
    steps: list = []
    pen = s.generate(GenerateRequest(**req, presence_penalty=1.5, frequency_penalty=1.0), steps.append)
    rows = [st.logits for st in steps if st.token >= 0]
    counts: dict[int, int] = {}
    for tok, row in zip(pen.tokens, rows):
        adj = row.copy()
        for t, n in counts.items():
            adj[t] -= np.float32(1.5) + np.float32(1.0) * n
        assert tok == int(np.argmax(adj))
        counts[tok] = counts.get(tok, 0) + 1
    assert pen.tokens != plain.tokens  # the penalties changed the answer


def test_penalties_over_http_and_their_bounds(client) -> None:
    a = chat(client, presence_penalty=2.0, frequency_penalty=-2.0)
    assert a["choices"][0]["finish_reason"] in ("stop", "length")
    r = client.post("/v1/chat/completions", json={**CHAT, "frequency_penalty": 2.5})
    assert r.status_code == 422 and r.json()["error"]["param"] == "frequency_penalty"
    assert chat(client)["choices"][0]["message"]["content"]  # the server goes on
