"""POST /v1/completions (prompt scoring) and the tokenizer routes through the test client: the
OpenAI legacy answer shape lm-eval reads, KV reuse across requests, every refusal. SmolLM2."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bmoe.rules import TOP_CAP
from bmoe.runtime.results import ScoreRequest
from helpers.server import metric

CTX = "Question: What is the capital of France?\nAnswer:"


@pytest.fixture()
def app(make_app, smol_path):
    return make_app(smol_path, n_ctx=256, flash_attn=False)


@pytest.fixture()
def client(app):
    with TestClient(app, base_url="http://localhost") as c:
        yield c


def tokenize(c: TestClient, text: str, special: bool = False) -> list[int]:
    r = c.post("/tokenize", json={"prompt": text, "add_special_tokens": special})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 256
    return body["tokens"]


def test_tokenizer_routes(client, app) -> None:
    info = client.get("/tokenizer_info").json()
    model = app.state.session.model
    assert info["eos_token"] == "<|im_end|>" and info["eos_token_id"] == model.eos
    assert info["bos_token_id"] == model.bos and info["vocab_size"] == model.n_vocab
    assert info["model_max_length"] == 256 and "im_start" in info["chat_template"]
    toks = tokenize(client, "Héllo wörld<|im_end|>")
    assert toks == model.tokenize("Héllo wörld<|im_end|>", add_special=False, parse_special=True)
    assert toks[-1] == model.eos  # special tokens in the text are parsed, as lm-eval's eos_token_id needs
    assert client.post("/detokenize", json={"tokens": toks}).json() == {"prompt": "Héllo wörld<|im_end|>"}


def test_echo_scores_every_position_as_the_session_does(client, app) -> None:
    session = app.state.session
    toks = tokenize(client, CTX + " Paris")
    r = client.post(
        "/v1/completions",
        json={
            "model": "x",
            "prompt": toks,
            "echo": True,
            "logprobs": 3,
            "max_tokens": 1,
            "temperature": 0,
            "seed": 1234,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and len(body["choices"]) == 1
    ch = body["choices"][0]
    lp = ch["logprobs"]
    n = len(toks)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    # the answer is the session's own scores (reuse=False here is the same pieces: an empty KV
    # before this request, one prefill)
    ref = session.score(ScoreRequest(tokens=tuple(toks), top_n=3, n_predict=1, reuse=False))
    assert lp["token_logprobs"][1:] == [float(x) for x in ref.token_logprobs[1:]]
    assert ch["text"] == CTX + " Paris" + session.model.detokenize(list(ref.generated), special=True)
    assert ch["finish_reason"] == "length"
    for j in range(1, n + 1):
        top = lp["top_logprobs"][j]
        assert len(top) == 3 and list(top.values()) == sorted(top.values(), reverse=True)
        assert lp["token_logprobs"][j] <= max(top.values())
    # the generated token is the greedy one: lm-eval's is_greedy test holds for it by construction
    assert lp["token_logprobs"][n] == max(lp["top_logprobs"][n].values())
    # offsets index the text
    assert [ch["text"][o : o + len(t)] for o, t in zip(lp["text_offset"], lp["tokens"])] == lp["tokens"]
    u = body["usage"]
    assert (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) == (n, 1, n + 1)
    assert body["bmoe"]["n_reused"] + body["bmoe"]["n_prefilled"] == n


def test_consecutive_requests_reuse_the_context(client, app) -> None:
    ctx = tokenize(client, CTX)
    a, b = ctx + tokenize(client, " Paris"), ctx + tokenize(client, " Berlin")
    client.post("/v1/completions", json={"prompt": a, "echo": True, "logprobs": 1, "max_tokens": 0})
    r = client.post("/v1/completions", json={"prompt": b, "echo": True, "logprobs": 1, "max_tokens": 0}).json()
    assert r["bmoe"]["n_reused"] == len(ctx) - 1 == r["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert r["bmoe"]["prompts"][0]["n_prefilled"] == len(b) - len(ctx) + 1
    whole = app.state.session.score(ScoreRequest(tokens=tuple(b), reuse=False))
    # reused prefix + new tail against one prefill: a tolerance (docs/server.md "What is exact")
    np.testing.assert_allclose(
        r["choices"][0]["logprobs"]["token_logprobs"][1:], whole.token_logprobs[1:], atol=0.05, rtol=0
    )
    text = client.get("/metrics").text
    assert metric(text, "bmoe_reused_tokens_total") >= len(ctx) - 1


def test_prompt_forms_and_lists(client) -> None:
    ctx = tokenize(client, CTX)
    one = client.post("/v1/completions", json={"prompt": CTX, "max_tokens": 0, "echo": True, "logprobs": 0}).json()
    assert one["choices"][0]["text"] == CTX and one["usage"]["completion_tokens"] == 0
    assert all(t == {} for t in one["choices"][0]["logprobs"]["top_logprobs"][1:])  # logprobs 0: no alternatives
    texts = client.post("/v1/completions", json={"prompt": [CTX, CTX + " Paris"], "max_tokens": 1}).json()
    ids = client.post(
        "/v1/completions", json={"prompt": [ctx, ctx + tokenize(client, " Paris")], "max_tokens": 1}
    ).json()
    assert [c["index"] for c in texts["choices"]] == [0, 1]
    assert [c["text"] for c in texts["choices"]] == [c["text"] for c in ids["choices"]]
    assert all(c["logprobs"] is None for c in texts["choices"])  # no logprobs asked for
    assert len(texts["bmoe"]["prompts"]) == 2 and texts["bmoe"]["prompts"][1]["n_reused"] > 0
    # without echo: logprobs of the picked token only, its offset after the prompt
    seen = set()
    for prompt in (CTX, "The capital of France is"):
        r = client.post("/v1/completions", json={"prompt": prompt, "logprobs": 2, "max_tokens": 1}).json()["choices"][0]
        assert len(r["logprobs"]["tokens"]) == 1 and r["logprobs"]["text_offset"] == [len(prompt)]
        seen.add(r["finish_reason"])
        # an end-of-turn token is reported in logprobs but adds no text, as OpenAI's API did
        assert r["text"] == ("" if r["finish_reason"] == "stop" else r["logprobs"]["tokens"][0])
    assert seen == {"stop", "length"}  # SmolLM2 ends the turn after "Answer:", goes on after "is"


def test_a_token_split_over_utf8_is_named_by_its_bytes(client) -> None:
    toks = tokenize(client, "日本語のテキスト")
    r = client.post("/v1/completions", json={"prompt": toks, "echo": True, "logprobs": 1, "max_tokens": 0}).json()
    lp = r["choices"][0]["logprobs"]
    assert r["choices"][0]["text"] == "日本語のテキスト"
    assert any(t.startswith("bytes:\\x") for t in lp["tokens"])  # SmolLM2 splits some of these characters
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][-1] < len("日本語のテキスト")


def err(r, status: int) -> dict:
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert e["type"] == "invalid_request_error"
    return e


@pytest.mark.parametrize(
    "body, status, param, message",
    [
        ({"prompt": ""}, 400, "prompt", "prompt: is empty; give at least one token"),
        ({"prompt": []}, 422, "prompt", "prompt: at least 1 item, got 0"),
        ({"prompt": [[]]}, 422, "prompt.0", "prompt.0: at least 1 item, got 0"),
        ({"prompt": ["a", ""]}, 400, "prompt.1", "prompt.1: is empty; give at least one token"),
        ({"prompt": [5, 49152]}, 400, "prompt.1", "prompt.1: 49152 is not a token id of this model (0..49151)"),
        ({"prompt": [[5], [7, -3]]}, 400, "prompt.1.1", "prompt.1.1: -3 is not a token id of this model (0..49151)"),
        ({"prompt": [5, True]}, 422, "prompt.1", None),
        (
            {"prompt": [7] * 300, "max_tokens": 1},
            400,
            "prompt",
            "prompt: 300 tokens, plus 1 to pick, do not fit the context (n_ctx 256)",
        ),
        (
            {"prompt": [7] * 300},
            400,
            "prompt",
            "prompt: 300 tokens leave no room to generate in the context (n_ctx 256)",
        ),
        (
            {"prompt": [[5], [7] * 200], "max_tokens": 100},
            400,
            "prompt.1",
            "prompt.1: 200 tokens, plus max_tokens (100), do not fit the context (n_ctx 256)",
        ),
        (
            {"prompt": "x", "logprobs": TOP_CAP + 1},
            422,
            "logprobs",
            f"logprobs: Input should be less than or equal to {TOP_CAP}",
        ),
        ({"prompt": "x", "n": 2}, 400, "n", "n: only 1 is supported, got 2"),
        ({"prompt": "x", "best_of": 3}, 400, "best_of", "best_of: only 1 is supported, got 3"),
        ({"prompt": "x", "suffix": "y"}, 400, "suffix", "suffix: insertion (a suffix) is not supported"),
        (
            {"prompt": "x", "logit_bias": {"49152": 1.0}},
            400,
            "logit_bias",
            "logit_bias: 49152 is not a token id of this model (0..49151)",
        ),
        (
            {"prompt": "x", "logit_bias": {"5": 101}},
            422,
            "logit_bias.5",
            "logit_bias.5: Input should be less than or equal to 100",
        ),
        (
            {"prompt": "x", "presence_penalty": 2.5},
            422,
            "presence_penalty",
            "presence_penalty: Input should be less than or equal to 2",
        ),
        (
            b'{"prompt": "x", "temperature": Infinity}',
            422,
            "temperature",
            "temperature: Input should be a finite number",
        ),
    ],
)
def test_completion_refusals(client, app, body, status, param, message) -> None:
    kv = list(app.state.session.kv.tokens)
    sent = (
        {"content": body, "headers": {"Content-Type": "application/json"}}
        if isinstance(body, bytes)
        else {"json": body}
    )
    e = err(client.post("/v1/completions", **sent), status)
    assert e["param"] == param and (message is None or e["message"] == message), e
    assert app.state.session.kv.tokens == kv  # refused before any work
    assert client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 1}).status_code == 200


@pytest.mark.parametrize(
    "path, body, status, param",
    [
        ("/tokenize", {"prompt": 5}, 422, "prompt"),
        ("/tokenize", {"prompt": "x", "messages": []}, 422, "messages"),
        ("/detokenize", {"tokens": [1, 49152]}, 400, "tokens.1"),
        ("/detokenize", {"tokens": ["a"]}, 422, "tokens.0"),
    ],
)
def test_tokenizer_refusals(client, path, body, status, param) -> None:
    assert err(client.post(path, json=body), status)["param"] == param
    assert client.post("/tokenize", json={"prompt": "ok"}).status_code == 200


def test_a_client_that_leaves_mid_list_stops_the_scoring_and_is_counted(app) -> None:
    """The worker side of /v1/completions with a list of prompts: when the job is cancelled (the
    client went away) after the first prompt, the second is not scored, the job ends as
    Cancelled (a 499 for nobody), and what was scored counts in the metrics."""
    from bmoe.server.completions_route import CompletionsRoute
    from bmoe.server.job_queue import Cancelled, Job
    from bmoe.server.schemas import CompletionRequest

    session, metrics = app.state.session, app.state.metrics
    route = CompletionsRoute(app.state.queue, metrics, "m")
    fn = route._fn(CompletionRequest(model="m", prompt=["The sea is", "The sky is"], max_tokens=1))
    job = object.__new__(Job)
    job.cancelled = __import__("threading").Event()
    scored = []
    real_score = session.score

    def score_then_leave(req):  # noqa: ANN001
        scored.append(req)
        job.cancelled.set()
        return real_score(req)

    before = metrics.render().decode()
    session.score = score_then_leave
    try:
        with pytest.raises(Cancelled):
            fn(session, job)
    finally:
        del session.score
    text = metrics.render().decode()
    assert len(scored) == 1
    assert metric(text, "bmoe_cancelled_total") == metric(before, "bmoe_cancelled_total") + 1
    # the scored prompt's prefill counts
    assert metric(text, "bmoe_prompt_tokens_total") > metric(before, "bmoe_prompt_tokens_total")
