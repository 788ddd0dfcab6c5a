"""The HTTP API through FastAPI's test client on SmolLM2: chat (streamed and not), multi-turn KV
reuse, stop strings, decisions, models/health/session, metrics."""

from __future__ import annotations

import json
import math

import pytest
from fastapi.testclient import TestClient

from helpers.server import label_sets, metric, sse_events

Q1 = "Name three fruits."
DECISION = {
    "prefix": "What is the capital of France?\n",
    "suffix": "Options:\nA) Paris\nB) London\nC) Rome\nAnswer with the letter.",
    "choices": ["A", "B", "C"],
}


@pytest.fixture()
def client(make_app, smol_path):
    with TestClient(make_app(smol_path), base_url="http://localhost") as c:
        yield c


def test_chat_answers_with_usage_and_telemetry(client) -> None:
    r = client.post("/v1/chat/completions", json={"model": "anything", "messages": [{"role": "user", "content": Q1}]})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"].strip()
    assert choice["finish_reason"] in ("stop", "length")
    u = body["usage"]
    assert u["completion_tokens"] == body["bmoe"]["tokens"] > 0
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert body["bmoe"]["prefill_tps"] > 0 and body["bmoe"]["tok_s"] > 0


def test_streamed_chat_equals_the_whole_answer(client) -> None:
    req = {"messages": [{"role": "user", "content": Q1}], "max_tokens": 12}
    # The server continues the KV: after this warm-up, both compared requests reuse all but the
    # prompt's last token and prefill that one alone, the same pieces (docs/testing.md).
    client.post("/v1/chat/completions", json=req)
    whole = client.post("/v1/chat/completions", json=req).json()
    r = client.post("/v1/chat/completions", json={**req, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if isinstance(e, dict)]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]  # greedy: the same answer
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(final) == 1 and final[0]["bmoe"]["tokens"] == 12
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12


def test_second_turn_reuses_the_kv_prefix(client) -> None:
    first = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "system", "content": "You are brief."}, {"role": "user", "content": Q1}]},
    ).json()
    answer = first["choices"][0]["message"]["content"]
    second = client.post(
        "/v1/chat/completions",
        json={
            "messages": [
                {"role": "system", "content": "You are brief."},
                {"role": "user", "content": Q1},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "Which of them is yellow?"},
            ]
        },
    ).json()
    assert second["bmoe"]["n_reused"] > 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == second["bmoe"]["n_reused"]
    # An edited history is prefilled whole instead (still answered).
    edited = client.post(
        "/v1/chat/completions",
        json={
            "messages": [
                {"role": "user", "content": Q1},
                {"role": "assistant", "content": "Something else."},
                {"role": "user", "content": "Which of them is yellow?"},
            ]
        },
    ).json()
    assert edited["bmoe"]["n_reused"] < second["bmoe"]["n_reused"] + second["bmoe"]["n_prompt"]


def test_stop_string_cuts_the_answer_and_keeps_the_turn(client, make_app, smol_path) -> None:
    req = {"messages": [{"role": "user", "content": "Count from 1 to 20, separated by commas."}], "max_tokens": 40}
    client.post("/v1/chat/completions", json=req)  # warm-up: the three compared requests run the same pieces
    full = client.post("/v1/chat/completions", json=req).json()["choices"][0]["message"]["content"]
    assert "5" in full
    stop = "5"
    cut = client.post("/v1/chat/completions", json={**req, "stop": [stop]}).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["message"]["content"] == full[: full.index(stop)]
    streamed = client.post("/v1/chat/completions", json={**req, "stop": stop, "stream": True})
    text = "".join(
        e["choices"][0]["delta"].get("content", "")
        for e in sse_events(streamed.text)
        if isinstance(e, dict) and e["choices"]
    )
    assert text == full[: full.index(stop)]
    session = client.app.state.session
    assert session.history[-1].content == text  # the turn is kept as the client saw it


def test_decide_single_and_batch(client) -> None:
    # the session's first batch opens its side sequences (--decide-batch auto), which empties the
    # context once: open them first, so that the batch below finds the single call's prefix kept
    assert client.post("/v1/decide", json=[{**DECISION, "id": 5}, {**DECISION, "id": 6}]).status_code == 200
    assert client.get("/v1/session").json()["stats"]["side_sequences"] > 0
    one = client.post("/v1/decide", json={**DECISION, "id": 7})
    assert one.status_code == 200
    d = one.json()
    assert d["id"] == 7 and len(d["choice_logp"]) == 3 and d["best"] == max(range(3), key=d["choice_logp"].__getitem__)
    assert math.isclose(sum(math.exp(x) for x in d["choice_logp"]) + d["p_outside"], 1.0, abs_tol=1e-6)
    assert {"n_tokens", "n_reused", "prefill_s", "prefill_tps", "reuse", "abstained"} <= d.keys()
    batch = client.post(
        "/v1/decide",
        json=[{**DECISION, "id": 1}, {**DECISION, "id": 2, "abstain_below": 0.99}, {"id": 3, "choices": ["A", "A"]}],
    )
    assert batch.status_code == 200
    a, b, c = batch.json()
    assert a["n_reused"] > 0 and a["reuse"] == "restored"  # the prefix kept by the single call
    assert a["choice_logp"] == pytest.approx(d["choice_logp"], abs=1e-4)
    assert b["abstained"] is True and b["best"] == -1
    assert c == {"id": 3, "error": c["error"]} and "first token" in c["error"]


def test_models_health_session(client) -> None:
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1"
    assert client.get("/health").json()["status"] == "ok"
    info = client.get("/v1/session").json()
    assert info["n_ctx"] == 1024 and info["decide"] is True and info["config"]["n_predict"] == 16
    assert "/" not in json.dumps(info["config"])  # no filesystem paths


def test_page_and_its_files_are_served(client) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "Choose from options" in page.text
    assert client.get("/static/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/style.css").status_code == 200
    assert "http" not in client.get("/static/app.js").text.replace("http.", "")  # nothing fetched from elsewhere


def test_metrics_move(client) -> None:
    before = client.get("/metrics").text
    client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": Q1}], "max_tokens": 5})
    client.post("/v1/decide", json=DECISION)
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/static/nothing.js").status_code == 404
    after = client.get("/metrics").text
    for name in (
        "bmoe_completion_tokens_total",
        "bmoe_prompt_tokens_total",
        "bmoe_prefill_seconds_total",
        "bmoe_decode_seconds_total",
    ):
        assert metric(after, name) > metric(before, name), name
    assert metric(after, "bmoe_completion_tokens_total") - metric(before, "bmoe_completion_tokens_total") == 5
    # the labelled counters: nothing counted before, exactly this chat turn and decision after
    assert label_sets(before, "bmoe_chat_completions_total") == label_sets(before, "bmoe_decisions_total") == []
    assert metric(after, "bmoe_chat_completions_total", finish_reason="length") == 1
    assert metric(after, "bmoe_decisions_total", reuse="stored") == 1
    assert metric(after, "bmoe_http_requests_total", route="/v1/chat/completions", status="200") == 1
    assert metric(after, "bmoe_http_requests_total", route="/v1/decide", status="200") == 1
    # the page's files are routes of their own; an unknown path counts as "other"
    assert metric(after, "bmoe_http_requests_total", route="/static/app.js", status="200") == 1
    assert metric(after, "bmoe_http_requests_total", route="other", status="404") == 1
    assert "bmoe_flash_read_mib_total" in after and "bmoe_expert_cache_hit_percent -1.0" in after
