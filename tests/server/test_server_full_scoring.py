"""/v1/decide with scoring "full": the answer's keys, and each refusal naming its field, on the
tiny MoE; one bad item of a list spoils only itself."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

FULL = {"prefix": "Pick one.\n", "suffix": "Which?", "choices": ["Open Settings", "A", "Call Mom"], "scoring": "full"}


@pytest.fixture()
def client(make_app, tiny_path):
    with TestClient(make_app(tiny_path, n_ctx=256, decide_batch=2), base_url="http://localhost") as c:
        yield c


def test_full_answer_keys(client) -> None:
    r = client.post("/v1/decide", json={**FULL, "best_by": "norm", "unconditional": "Answer:"})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["scoring"] == "full" and d["best_by"] == "norm"
    n = len(FULL["choices"])
    for key in (
        "choice_logp",
        "choice_tokens",
        "choice_logp_mean",
        "choice_logp_norm",
        "choice_token_logp",
        "choice_logp_neutral",
        "choice_logp_uncond",
    ):
        assert len(d[key]) == n, key
    assert [len(t) for t in d["choice_token_logp"]] == d["choice_tokens"]
    assert d["best"] == max(range(n), key=lambda i: d["choice_logp_norm"][i])
    assert d["uncond_reuse"] == "stored" and d["score_tokens"] > 0 and d["uncond_state_mib"] > 0
    first = client.post("/v1/decide", json={**FULL, "choices": ["A", "B"], "scoring": "first"}).json()
    assert "choice_tokens" not in first and "score_tokens" not in first and first["best_by"] == "sum"


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({**FULL, "scoring": "all"}, "scoring", '"scoring" is "all"'),
        ({**FULL, "best_by": "max"}, "best_by", '"best_by" is "max"'),
        ({**FULL, "scoring": "first", "choices": ["A", "B"], "best_by": "mean"}, "best_by", 'needs "scoring": "full"'),
        ({**FULL, "scoring": "first", "choices": ["A", "B"], "unconditional": "x"}, "unconditional", 'needs "scoring"'),
        ({**FULL, "choices": ["A", ""]}, "choices", "tokenizes to no tokens"),
        ({**FULL, "choices": ["A", "word " * 300]}, "choices", "do not fit the context of 256"),
    ],
)
def test_full_refusals_name_the_field(client, body, param: str, words: str) -> None:
    r = client.post("/v1/decide", json=body)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == param and words in e["message"]
    assert client.post("/v1/decide", json=FULL).status_code == 200


def test_a_bad_item_of_a_list_spoils_only_itself(client) -> None:
    r = client.post("/v1/decide", json=[{**FULL, "id": 1}, {**FULL, "id": 2, "best_by": "max"}, {**FULL, "id": 3}])
    assert r.status_code == 200
    a, bad, c = r.json()
    assert "error" in bad and bad["id"] == 2
    assert a["choice_logp"] == c["choice_logp"] and a["scoring"] == "full"


def test_a_plain_decide_session_opens_side_sequences_for_full_scoring(make_app, tiny_path) -> None:
    """decide_batch auto (the default): the first full-scored request opens them."""
    with TestClient(make_app(tiny_path, n_ctx=256), base_url="http://localhost") as c:
        r = c.post("/v1/decide", json=FULL)
        assert r.status_code == 200, r.text
        assert r.json()["scoring"] == "full" and len(r.json()["choice_tokens"]) == 3


def test_without_side_sequences_full_scoring_is_refused(make_app, tiny_path) -> None:
    with TestClient(make_app(tiny_path, n_ctx=256, decide_batch=1), base_url="http://localhost") as c:
        r = c.post("/v1/decide", json=FULL)
        assert r.status_code == 400 and r.json()["error"]["param"] == "scoring"
        assert "--decide-batch auto (the default) or 2 or more" in r.json()["error"]["message"]
        assert c.post("/v1/decide", json={**FULL, "choices": ["A", "B"], "scoring": "first"}).status_code == 200
