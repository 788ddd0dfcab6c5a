"""/v1/decide with the structured form and order debiasing, on the tiny MoE (its answers mean
nothing; what is checked is that the fields arrive, the keys come back, and refusals name the
field)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from bmoe.server import ServerSettings

ASK = {"prefix": "Pick one.\n", "question": "Which?", "options": ["red", "green", "blue"]}


@pytest.fixture()
def client(make_app, tiny_path):
    app = make_app(tiny_path, ServerSettings(), n_ctx=256)
    with TestClient(app, base_url="http://localhost") as c:
        yield c


def test_debiased_answers_carry_raw_and_debiased_keys(client) -> None:
    plain = client.post("/v1/decide", json={**ASK, "render": {"joiner": " ", "labels": ["1", "2", "3"]}})
    assert plain.status_code == 200, plain.text
    assert "debiased_p" not in plain.json()
    got = client.post(
        "/v1/decide",
        json=[
            {**ASK, "id": 1, "debias": "permute"},
            {**ASK, "id": 2, "debias": "contextual"},
            {**ASK, "id": 3, "debias": "nope"},
        ],
    ).json()
    assert [g["id"] for g in got] == [1, 2, 3]
    permuted, calibrated, refused = got
    assert permuted["debias"] == "permute" and permuted["debias_decisions"] == 3
    assert sum(permuted["debiased_p"]) == pytest.approx(1.0) and len(permuted["choice_logp"]) == 3
    assert permuted["best"] == max(range(3), key=permuted["debiased_p"].__getitem__)
    assert calibrated["debias_decisions"] == 2 and sum(calibrated["prior"]) == pytest.approx(1.0)
    assert refused == {"id": 3, "error": 'decide: "debias" is "nope"; give one of "permute", "pride", "contextual"'}


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"suffix": "A or B?", "choices": ["A", "B"], "debias": "permute"}, 400, "debias"),
        ({**ASK, "options": ["red"], "debias": "pride"}, 400, "options"),
        ({**ASK, "render": {"labels": ["A", "A", "B"]}}, 400, "render"),
        ({**ASK, "render": {"colour": "red"}}, 422, "render.colour"),
        ({"prefix": "x", "question": "Which?"}, 422, "choices"),
    ],
)
def test_refusals_name_the_field(client, body, status, param) -> None:
    r = client.post("/v1/decide", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
    assert client.post("/v1/decide", json={**ASK, "debias": "permute"}).status_code == 200


def test_a_request_over_the_work_limit_is_refused_before_it_runs(make_app, tiny_path) -> None:
    """Each permutation, pride sample and fully scored choice counts one decision against
    --max-request-decisions; the refusal comes before anything is queued."""
    app = make_app(tiny_path, ServerSettings(max_request_decisions=5), n_ctx=256)
    with TestClient(app, base_url="http://localhost") as c:
        before = c.get("/v1/models").json()["data"][0]["meta"]["stats"]
        six = {**ASK, "options": ["a", "b", "c", "d", "e", "f"], "debias": "permute"}
        r = c.post("/v1/decide", json=six)
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "too_much_work"
        assert r.json()["error"]["message"].startswith(
            "decide: this request may run 6 decisions (each debias permutation, pride sample and choice scored in "
            "full counts one), over this server's limit of 5 a request (--max-request-decisions)"
        )
        # a list is counted whole: two 3-option permutations are 6
        assert c.post("/v1/decide", json=[{**ASK, "debias": "permute"}] * 2).status_code == 400
        assert c.get("/v1/models").json()["data"][0]["meta"]["stats"] == before  # nothing ran
        ok = c.post("/v1/decide", json={**ASK, "debias": "permute"})  # 3 decisions
        assert ok.status_code == 200 and ok.json()["debias_decisions"] == 3
