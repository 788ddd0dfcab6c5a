"""Images through the server (issue #30) on the tiny qwen3vlmoe and its converted projector: the
official openai client's image_url parts on /v1/chat/completions, images on /v1/decide, the same
answers as the session gives, and refusals that name what was wrong and leave the server usable."""

from __future__ import annotations

import base64
from pathlib import Path

import openai
import pytest
from fastapi.testclient import TestClient

from bmoe import DecideRequest
from bmoe.config import SessionConfig
from bmoe.session import Session
from bmoe.testing import write_hf_arch, write_hf_mmproj, write_png
from helpers.server import openai_client

ARCH = "qwen3vlmoe"
MARK = "<__media__>"
DECISION = {
    "prefix": "You control a phone. Task: open the camera.\n",
    "suffix": "Options:\nA) Settings\nB) Camera\nC) Mail\nAnswer with the letter.",
    "choices": ["A", "B", "C"],
}
KW = {"chat": "chatml", "n_ctx": 1024, "n_predict": 8, "decide": True, "n_threads": 1}


def data_url(path: str | Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


@pytest.fixture(scope="module")
def vl(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("server-images")
    screen = write_png(d / "screen.png", 128, 96, seed=1)  # 12 image tokens
    other = write_png(d / "other.png", 96, 128, seed=2)
    (d / "corrupt.png").write_bytes(screen.read_bytes()[:80])
    return {
        "model": write_hf_arch(ARCH, "q8_0", tiny_dir),
        "mmproj": write_hf_mmproj(ARCH, tiny_dir),
        "screen": data_url(screen),
        "other": data_url(other),
        "corrupt": data_url(d / "corrupt.png"),
        "path": str(screen),
    }


@pytest.fixture()
def client(make_app, vl):
    with TestClient(make_app(vl["model"], mmproj=vl["mmproj"], **KW), base_url="http://localhost") as c:
        yield c


@pytest.fixture()
def session(vl):
    s = Session(SessionConfig(model=vl["model"], mmproj=vl["mmproj"], **KW))
    yield s
    s.close()


def image_message(text: str, url: str, text_first: bool = False) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
    return {"role": "user", "content": parts[::-1] if text_first else parts}


def test_decide_with_an_image_is_the_sessions_decision(client, session, vl) -> None:
    body = {**DECISION, "images": [vl["screen"]]}
    r = client.post("/v1/decide", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    want = session.decide(
        DecideRequest(
            id=0,
            prefix=DECISION["prefix"],
            suffix=DECISION["suffix"],
            choices=tuple(DECISION["choices"]),
            images=(vl["screen"],),
        )
    )
    assert want.error is None
    assert got["choice_logp"] == list(want.scores.choice_logp) and got["p_outside"] == want.scores.p_outside
    # the kept prefix holds the image: the same decision again restores it
    again = client.post("/v1/decide", json=body).json()
    assert again["reuse"] == "restored" and again["choice_logp"] == got["choice_logp"]
    plain = client.post("/v1/decide", json=DECISION).json()
    assert plain["choice_logp"] != got["choice_logp"]  # the image is in the prompt
    assert got["n_tokens"] >= plain["n_tokens"] + 12
    # a marker places it: in the suffix
    marked = client.post(
        "/v1/decide", json={**DECISION, "suffix": "Screen: " + MARK + DECISION["suffix"], "images": [vl["other"]]}
    )
    assert marked.status_code == 200 and marked.json()["choice_logp"] != got["choice_logp"]


def test_decide_refusals_name_the_image_and_leave_the_server_usable(client, vl) -> None:
    body = {**DECISION, "images": [vl["screen"]]}
    before = client.post("/v1/decide", json=body).json()
    cases = [
        ("https://example.com/shot.png", "no network fetches", "images.0", "remote_image_url"),
        ("http://10.0.0.1/a.png", "no network fetches", "images.0", "remote_image_url"),
        (vl["path"], "reads no files", "images.0", "image_not_inline"),
        (vl["corrupt"], "decide: images[0] (80 bytes) is corrupt", "images", "decide_refused"),
        (
            "data:image/png;base64,@@@",
            "images.0 is a data: URL whose base64 does not decode",
            "images.0",
            "bad_data_url",
        ),
        ("DATA:/../etc/passwd", "images.0 is a data: URL that is not base64", "images.0", "bad_data_url"),
        (
            "data:text/plain;base64," + base64.b64encode(b"not a picture").decode(),
            "is not an image",
            "images",
            "decide_refused",
        ),
    ]
    for url, words, param, code in cases:
        r = client.post("/v1/decide", json={**DECISION, "images": [url]})
        assert r.status_code == 400, (url[:40], r.text)
        err = r.json()["error"]
        assert words in err["message"] and err["param"] == param and err["code"] == code, err
    assert (
        "is corrupt"
        in client.post("/v1/decide", json={**DECISION, "images": [vl["corrupt"]]}).json()["error"]["message"]
    )
    two = client.post(
        "/v1/decide", json={**DECISION, "prefix": MARK + DECISION["prefix"], "images": [vl["screen"], vl["other"]]}
    )
    assert (
        two.status_code == 400 and "2 image(s) but the prompt has 1 image marker(s)" in two.json()["error"]["message"]
    )
    # a list: the bad item is refused by itself, as decide_batch does
    batch = client.post("/v1/decide", json=[{**body, "id": 1}, {**DECISION, "id": 2, "images": [vl["corrupt"]]}])
    assert batch.status_code == 200
    ok, bad = batch.json()
    assert ok["choice_logp"] == before["choice_logp"] and "is corrupt" in bad["error"]
    remote = client.post("/v1/decide", json=[{**body, "id": 1}, {**DECISION, "id": 2, "images": ["https://x/a.png"]}])
    assert remote.status_code == 400 and remote.json()["error"]["param"] == "1.images.0"
    after = client.post("/v1/decide", json=body).json()
    assert after["choice_logp"] == before["choice_logp"]


def test_images_without_mmproj_are_a_400_naming_it(make_app, vl) -> None:
    with TestClient(make_app(vl["model"], **KW), base_url="http://localhost") as c:
        r = c.post("/v1/decide", json={**DECISION, "images": [vl["screen"]]})
        assert r.status_code == 400 and "open it with --mmproj" in r.json()["error"]["message"]
        chat = c.post("/v1/chat/completions", json={"messages": [image_message("What is this?", vl["screen"])]})
        assert chat.status_code == 400 and "--mmproj" in chat.json()["error"]["message"]


def test_chat_image_parts_are_the_sessions_images(client, session, vl) -> None:
    msg = image_message("What is on the screen?", vl["screen"])
    r = client.post("/v1/chat/completions", json={"messages": [msg], "temperature": 0, "max_tokens": 6})
    assert r.status_code == 200, r.text
    body = r.json()
    from bmoe import GenerateRequest

    want = session.generate(
        GenerateRequest(prompt=MARK + "What is on the screen?", images=(vl["screen"],), n_predict=6, temperature=0.0)
    )
    assert body["choices"][0]["message"]["content"] == want.text
    assert body["usage"]["prompt_tokens"] == want.n_prompt + want.n_reused
    # the next turn sends the conversation again, image included: its KV, image and all, is reused
    conv = [
        msg,
        {"role": "assistant", "content": body["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And now?"},
    ]
    nxt = client.post("/v1/chat/completions", json={"messages": conv, "temperature": 0, "max_tokens": 4})
    assert nxt.status_code == 200, nxt.text
    assert nxt.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= body["usage"]["prompt_tokens"]
    # an image in the second turn's message too
    conv2 = conv[:2] + [image_message("And this one?", vl["other"], text_first=True)]
    two = client.post("/v1/chat/completions", json={"messages": conv2, "temperature": 0, "max_tokens": 4})
    assert two.status_code == 200, two.text
    assert two.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= body["usage"]["prompt_tokens"]


def test_chat_refusals_and_the_server_stays_usable(client, vl) -> None:
    ok = {"messages": [image_message("What is on the screen?", vl["screen"])], "temperature": 0, "max_tokens": 4}
    before = client.post("/v1/chat/completions", json=ok).json()["choices"][0]["message"]["content"]
    cases = [
        (
            [image_message("hi", "https://example.com/a.png")],
            "no network fetches",
            "messages.0.content.0.image_url.url",
        ),
        ([image_message("hi", vl["path"])], "reads no files", "messages.0.content.0.image_url.url"),
        ([image_message("hi", vl["corrupt"])], "is corrupt", "messages"),
        (
            [
                {"role": "system", "content": [{"type": "image_url", "image_url": {"url": vl["screen"]}}]},
                {"role": "user", "content": "hi"},
            ],
            "user messages only",
            "messages.0.content",
        ),
        ([image_message("see " + MARK, vl["screen"])], "cannot be text", "messages.0.content.1.text"),
        (
            [
                {"role": "user", "content": "a " + MARK},
                {"role": "assistant", "content": "ok"},
                image_message("hi", vl["screen"]),
            ],
            "cannot be text",
            "messages.0.content",
        ),
    ]
    for messages, words, param in cases:
        r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
        assert r.status_code == 400, (words, r.text)
        err = r.json()["error"]
        assert words in err["message"] and err["param"] == param, err
    # the same for a streamed request: refused before the stream starts
    r = client.post(
        "/v1/chat/completions", json={**ok, "stream": True, "messages": [image_message("hi", vl["corrupt"])]}
    )
    assert r.status_code == 400 and "is corrupt" in r.json()["error"]["message"]
    # without images the marker is text, as ever
    assert (
        client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": MARK}], "max_tokens": 2}
        ).status_code
        == 200
    )
    after = client.post("/v1/chat/completions", json=ok).json()["choices"][0]["message"]["content"]
    assert after == before


def test_the_openai_client_sends_image_url_parts(make_app, vl, live) -> None:
    server = live(make_app(vl["model"], mmproj=vl["mmproj"], **KW))
    client = openai_client(server.url, timeout=60)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is on the screen?"},
                {"type": "image_url", "image_url": {"url": vl["screen"], "detail": "low"}},
            ],
        }
    ]
    r = client.chat.completions.create(model="bmoe", messages=messages, max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.prompt_tokens > 12
    streamed = client.chat.completions.create(model="bmoe", messages=messages, max_tokens=4, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == r.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="no network fetches"):
        client.chat.completions.create(
            model="bmoe",
            max_tokens=2,
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}
            ],
        )


def test_the_scheme_in_any_case_is_a_data_url_never_a_path(client, vl, tmp_path, monkeypatch) -> None:
    """URL schemes are case-insensitive: ``DATA:`` is a data URL. A request cannot make the server
    open a path spelled ``DATA:/../...`` (with a folder named ``DATA:`` in its working directory it
    once did), nor tell an existing path from a missing one; a valid upper-case URL is answered as
    the lower-case one is, and the session is handed the image's bytes, never a string."""
    (tmp_path / "DATA:").mkdir()
    (tmp_path / "secret.png").write_bytes(base64.b64decode(vl["screen"].partition(",")[2]))
    monkeypatch.chdir(tmp_path)
    seen: list = []
    real = Session.decide_many

    def spy(self, requests, **kw):  # type: ignore[no-untyped-def]
        seen.extend(im for r in requests for im in r.images)
        return real(self, requests, **kw)

    monkeypatch.setattr(Session, "decide_many", spy)
    replies = [
        client.post("/v1/decide", json={**DECISION, "images": [url]})
        for url in ("DATA:/../secret.png", "DATA:/../missing.png", "Data:/../../../etc/passwd")
    ]
    assert [r.status_code for r in replies] == [400] * 3
    assert [r.json()["error"]["code"] for r in replies] == ["bad_data_url"] * 3
    assert seen == []  # refused before the session saw anything
    lower = client.post("/v1/decide", json={**DECISION, "images": [vl["screen"]]})
    upper = client.post(
        "/v1/decide", json={**DECISION, "images": ["DATA:image/png;BASE64," + vl["screen"].partition(",")[2]]}
    )
    assert lower.status_code == 200 and upper.status_code == 200, upper.text
    assert upper.json()["choice_logp"] == lower.json()["choice_logp"]
    assert seen and all(isinstance(im, bytes) for im in seen)
    chat = client.post(
        "/v1/chat/completions",
        json={"messages": [image_message("What is this?", "DATA:/../secret.png")], "max_tokens": 2},
    )
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "bad_data_url"
    assert chat.json()["error"]["param"] == "messages.0.content.0.image_url.url"


def test_a_png_bomb_is_a_400_before_anything_decodes_it(client, vl, monkeypatch) -> None:
    """A 48 KB PNG of 20000 x 20000 pixels (65 KB as a data URL, under the body limit) was decoded
    in full (2.6 GB, 9 s of the only worker) before the context refused it; in a 1 GiB cgroup the
    server was OOM-killed. It is refused from its header: the decoder is never called."""
    from helpers.image_bombs import DecoderSpy, png_bomb

    body = {**DECISION, "images": [vl["screen"]]}
    before = client.post("/v1/decide", json=body).json()
    spy = DecoderSpy(monkeypatch)
    url = "data:image/png;base64," + base64.b64encode(png_bomb()).decode()
    assert len(url) < 70_000
    words = (
        "images[0] (48685 bytes) is a 20000x20000 PNG (400000000 pixels): more than the 33554432 pixels bmoe decodes"
    )
    r = client.post("/v1/decide", json={**DECISION, "images": [url]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"].startswith("decide: " + words) and (err["param"], err["code"]) == ("images", "decide_refused")
    chat = client.post(
        "/v1/chat/completions", json={"messages": [image_message("What is this?", url)], "max_tokens": 2}
    )
    assert chat.status_code == 400
    err = chat.json()["error"]
    assert err["message"].startswith(words) and (err["param"], err["code"]) == ("messages", "invalid_request"), err
    streamed = client.post(
        "/v1/chat/completions",
        json={"messages": [image_message("What is this?", url)], "max_tokens": 2, "stream": True},
    )
    assert streamed.status_code == 400 and streamed.json()["error"]["message"].startswith(words)
    # under bmoe's absolute cap, but far more image tokens than n_ctx 1024 holds
    wide = "data:image/png;base64," + base64.b64encode(png_bomb(2000, 2000)).decode()
    chat = client.post(
        "/v1/chat/completions", json={"messages": [image_message("What is this?", wide)], "max_tokens": 2}
    )
    err = chat.json()["error"]
    assert chat.status_code == 400 and (err["param"], err["code"]) == ("messages", "context_length_exceeded"), err
    assert "is a 2000x2000 PNG (4000000 pixels): this projector makes about one image token per" in err["message"]
    assert spy.calls == 0
    after = client.post("/v1/decide", json=body).json()
    assert after["choice_logp"] == before["choice_logp"] and spy.calls == 1


def test_a_content_part_of_the_wrong_shape_names_its_field_once(client, vl) -> None:
    """``image_url`` given as a string (not ``{"url": ...}``) was reported as ``image_url.image_url``:
    pydantic put the part's type, the union's tag, in the path."""
    cases = [
        ({"type": "image_url", "image_url": vl["screen"]}, "messages.0.content.0.image_url"),
        ({"type": "text", "text": 5}, "messages.0.content.0.text"),
        ({"type": "video", "video": "x"}, "messages.0.content.0"),
    ]
    for part, param in cases:
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [part]}]})
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["message"].startswith(param + ": "), err
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [{"type": "video"}]}]})
    assert r.json()["error"]["message"] == "messages.0.content.0: a content part's type must be 'text' or 'image_url'"
