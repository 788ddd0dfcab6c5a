"""Images a session must refuse from their header, before decoding (issue #38 item 3), and images
in a raw prompt (--no-chat, issue #38 item 10), on every tiny vision-language model.

A 48 KB PNG can be a 20000 x 20000 image: decoded in full it took 2.6 GB and 9 s before the
context refused it. The refusals here are checked to happen before mtmd's decoder is called (a
spy counts its calls), and the session answers afterwards what it answered before.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from bmoe import DecideRequest, GenerateRequest
from bmoe.errors import RequestError
from bmoe.llama.image_size import MAX_PIXELS
from bmoe.testing import VL_ARCHS, write_hf_arch, write_hf_mmproj, write_png
from helpers.decide_prompts import ABC, P1, S2
from helpers.image_bombs import DecoderSpy, bmp_header, gif_header, jpeg_header, png_bomb

MARK = "<__media__>"


@pytest.fixture(scope="module", params=VL_ARCHS)
def vl(request: pytest.FixtureRequest, tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp(f"limits-{request.param}")
    return {
        "model": write_hf_arch(request.param, "q8_0", tiny_dir),
        "mmproj": write_hf_mmproj(request.param, tiny_dir),
        "screen": str(write_png(d / "screen.png", 128, 96, seed=1)),
        "big": str(write_png(d / "big.png", 1024, 768, seed=3)),
    }


def _open(open_session, vl: dict, **kw):
    kw.setdefault("chat", "chatml")
    return open_session(vl["model"], mmproj=vl["mmproj"], decide=True, **kw)


def _scores(r) -> tuple:
    assert r.error is None, r.error
    return r.scores.choice_logp, r.scores.p_outside, r.n_tokens


def test_a_png_bomb_is_refused_from_its_header_before_decoding(open_session, vl: dict, monkeypatch) -> None:
    bomb = png_bomb()
    assert len(bomb) < 64 * 1024  # a small file...
    s = _open(open_session, vl)
    good = DecideRequest(id=1, prefix=P1, suffix=S2, choices=ABC, images=(vl["screen"],))
    before = s.decide(good)
    spy = DecoderSpy(monkeypatch)
    url = "data:image/png;base64," + base64.b64encode(bomb).decode()
    want = (
        f"is a 20000x20000 PNG (400000000 pixels): more than the {MAX_PIXELS} pixels bmoe decodes; "
        "scale it down before sending it"
    )
    for source in (bomb, url):
        r = s.decide(DecideRequest(id=2, prefix=P1, suffix=S2, choices=ABC, images=(source,)))
        assert r.refused and want in r.error and r.error.startswith("decide: images[0] ("), r.error
        with pytest.raises(RequestError, match="images\\[0\\] .* is a 20000x20000 PNG") as exc:
            s.generate(GenerateRequest(prompt="hi", images=(source,), n_predict=1))
        assert exc.value.code == "image_too_large"
    assert spy.calls == 0  # ...refused before anything decoded it
    after = s.decide(good)
    assert spy.calls == 1 and _scores(after) == _scores(before)


def test_every_format_is_capped_and_a_bad_header_is_refused(open_session, vl: dict, monkeypatch) -> None:
    s = _open(open_session, vl)
    spy = DecoderSpy(monkeypatch)
    ihdr_zero = bytearray(png_bomb(8, 8))
    ihdr_zero[16:20] = b"\x00\x00\x00\x00"
    cases = {
        jpeg_header(30000, 30000): "is a 30000x30000 JPEG (900000000 pixels): more than",
        gif_header(40000, 40000): "is a 40000x40000 GIF (1600000000 pixels): more than",
        gif_header(64, 64, frame=(65535, 1024)): "is a 65535x1024 GIF",  # a frame past its screen
        bmp_header(20000, -20000): "is a 20000x20000 BMP (400000000 pixels): more than",
        png_bomb()[:20]: "is corrupt: its PNG header is cut short or malformed",
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 16: "is corrupt: its PNG header is cut short or malformed",
        bytes(ihdr_zero): "is corrupt: its PNG header says 0x8 pixels",
        b"\xff\xd8\xff\xe0\x00": "is corrupt: its JPEG header is cut short or malformed",
        b"\xff\xd8\xff\xe0\x00\x10JFIF\x00garbage-garbage": "is corrupt: its JPEG header is cut short or malformed",
        b"GIF89a\x01": "is corrupt: its GIF header is cut short or malformed",
        b"BM" + b"\x00" * 10: "is corrupt: its BMP header is cut short or malformed",
    }
    for data, words in cases.items():
        r = s.decide(DecideRequest(id=2, prefix=P1, suffix=S2, choices=ABC, images=(data,)))
        assert r.refused and words in r.error, (data[:12], r.error)
        with pytest.raises(RequestError, match=words.split(" (")[0].split(":")[0]):
            s.generate(GenerateRequest(prompt="hi", images=(data,), n_predict=1))
    assert spy.calls == 0
    assert s.decide(DecideRequest(id=3, prefix=P1, suffix=S2, choices=ABC, images=(vl["screen"],))).error is None


def test_an_image_too_big_for_the_context_is_refused_from_its_header(open_session, vl: dict, monkeypatch) -> None:
    """Under the absolute cap but far over what n_ctx 512 holds: refused before decoding. One only
    a little over (1024 x 768: 768 tokens) is decoded and refused by the context's own count."""
    s = _open(open_session, vl)
    cap = s.runtime.images.projector.pixel_cap(512)
    assert 128 * 96 * 512 / 12 < cap < MAX_PIXELS  # about twice the pixels of 512 tokens
    spy = DecoderSpy(monkeypatch)
    r = s.decide(DecideRequest(id=1, prefix=P1, suffix=S2, choices=ABC, images=(png_bomb(2000, 2000),)))
    assert (
        r.refused and "is a 2000x2000 PNG (4000000 pixels): this projector makes about one image token per" in r.error
    )
    assert "far more image tokens than the context holds (n_ctx 512); scale it down" in r.error
    assert spy.calls == 0
    big = s.decide(DecideRequest(id=2, prefix=P1, suffix=S2, choices=ABC, images=(vl["big"],)))
    assert big.refused and "768 of them its images'" in big.error and spy.calls == 1


def test_a_raw_prompt_takes_its_images_in_front_or_at_its_markers(open_session, vl: dict) -> None:
    """--no-chat: a request with images and no marker has them in front of its text, as under a
    template (it was refused as having "0 image marker(s)"); markers in the raw text place them."""
    s = _open(open_session, vl, chat="none")
    img = (vl["screen"],)
    front = s.decide(DecideRequest(id=1, prefix=P1, suffix=S2, choices=ABC, images=img))
    marked = s.decide(DecideRequest(id=2, prefix=MARK + P1, suffix=S2, choices=ABC, images=img))
    plain = s.decide(DecideRequest(id=3, prefix=P1, suffix=S2, choices=ABC))
    assert _scores(front) == _scores(marked)
    assert front.n_tokens >= plain.n_tokens + 12 and _scores(front) != _scores(plain)
    inside = s.decide(DecideRequest(id=4, prefix=P1, suffix=MARK + S2, choices=ABC, images=img))
    assert inside.error is None and _scores(inside) != _scores(front)
    g_front = s.generate(GenerateRequest(prompt="What is this?", images=img, n_predict=4, temperature=0.0))
    g_marked = s.generate(GenerateRequest(prompt=MARK + "What is this?", images=img, n_predict=4, temperature=0.0))
    assert (
        g_front.tokens == g_marked.tokens
        and g_front.n_prompt + g_front.n_reused == g_marked.n_prompt + g_marked.n_reused
    )
    toks = s.runtime.kv.tokens
    start = next(i for i, t in enumerate(toks) if t < -1)
    assert start <= 1 and toks[start : start + 12] == [toks[start]] * 12  # in front (after a BOS, if any)
    two = s.decide(DecideRequest(id=5, prefix=MARK + P1, suffix=S2, choices=ABC, images=img * 2))
    assert two.refused and "2 image(s) but the prompt has 1 image marker(s)" in two.error
