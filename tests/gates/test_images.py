"""Images in requests (issue #30) on every tiny vision-language model and its vision projector
(bmoe.testing.VL_ARCHS: qwen3vlmoe, and glm4vmoe, GLM-4.5V whose language model is glm4moe), bit for bit.

The projector (``--mmproj``, converted from the same HF folder by llama.cpp's converter) runs
resident; the language model runs resident, streamed with the cache off and streamed with an
evicting 1 MiB cache (MODES). What must hold:

* G1/G2 with an image: a generation over an image is the same tokens and the same logits bit for
  bit in every mode;
* G3 with an image: streaming that reads every expert of each routed layer gives the same
  generation and the same decision as resident, and routes all of them;
* G4 with an image: a session whose cache holds every expert gives, cold, what resident gives and,
  warm, the same again without reading a byte;
* G18a with an image: a decision after a restored prefix holding an image equals the same
  decision computed in the same pieces (prefix, then the rest) by a session that never kept it,
  in every mode and across modes; the kept prefix's image is not encoded again;
* an image in the suffix, a batch over a prefix with an image (each as alone);
* bad input is a refusal naming what was wrong, and the session answers afterwards exactly what
  it answered before.
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest

from bmoe import DecideRequest, GenerateRequest
from bmoe.errors import ConfigError, ModelFileError, RequestError
from bmoe.session import Message
from bmoe.testing import VL_ARCHS, write_hf_arch, write_hf_mmproj, write_png, write_tiny
from helpers.decide_prompts import ABC, MODES, P1, P2, S2, S3
from helpers.gates import record_routes

MARK = "<__media__>"


@pytest.fixture(scope="module", params=VL_ARCHS)
def vl(request: pytest.FixtureRequest, tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    arch = request.param
    model = write_hf_arch(arch, "q8_0", tiny_dir)
    mmproj = write_hf_mmproj(arch, tiny_dir)
    d = tmp_path_factory.mktemp(f"images-{arch}")
    return {
        "arch": arch,
        "model": model,
        "mmproj": mmproj,
        # 128 x 96 is 4 x 3 merged patches: 12 image tokens over 4 positions (M-RoPE)
        "screen": str(write_png(d / "screen.png", 128, 96, seed=1)),
        "other": str(write_png(d / "other.png", 96, 128, seed=2)),
        "big": str(write_png(d / "big.png", 1024, 768, seed=3)),  # 768 tokens: more than n_ctx 512
        "dir": d,
    }


def _open(open_session, vl: dict, mode: str, **kw):
    return open_session(vl["model"], mmproj=vl["mmproj"], chat="chatml", decide=True, **MODES[mode], **kw)


def _scores(r) -> tuple:
    assert r.error is None, r.error
    return r.scores.choice_logp, r.scores.p_outside, r.n_tokens


def test_image_tokens_take_fewer_positions_than_cells(open_session, vl: dict) -> None:
    s = _open(open_session, vl, "resident")
    rt = s.runtime
    [img] = rt.read_images([vl["screen"]])
    assert (img.n_tokens, img.n_pos) == (12, 4)  # the text after it starts 4 positions on, not 12
    r = s.generate(GenerateRequest(prompt=f"Look {MARK} here", images=(vl["screen"],), n_predict=1))
    assert not r.cancelled
    toks = rt.kv.tokens
    start = next(i for i, t in enumerate(toks) if t < -1)
    assert toks[start : start + 12] == [toks[start]] * 12
    assert rt.kv.pos_of(start + 12) == start + 4
    assert rt.kv.snap(start + 5) == start


@pytest.mark.parametrize("mode", [m for m in MODES if m != "resident"])
def test_g1_g2_generate_with_an_image_streamed_equals_resident(open_session, vl: dict, mode: str) -> None:
    req = GenerateRequest(prompt="What is on the screen?", images=(vl["screen"],), n_predict=12, keep_logits=True)
    ref = _open(open_session, vl, "resident").generate(req)
    got = _open(open_session, vl, mode).generate(req)
    assert got.tokens == ref.tokens
    assert len(got.logits) == len(ref.logits) > 0
    for a, b in zip(got.logits, ref.logits):
        np.testing.assert_array_equal(a, b)


def test_images_default_to_the_front_and_markers_place_them(open_session, vl: dict) -> None:
    s = _open(open_session, vl, "resident")
    req = GenerateRequest(prompt="What is on the screen?", n_predict=4, keep_logits=True)
    front = s.generate(GenerateRequest(**{**_fields(req), "images": (vl["screen"],)}))
    marked = s.generate(GenerateRequest(**{**_fields(req), "prompt": MARK + req.prompt, "images": (vl["screen"],)}))
    elsewhere = s.generate(GenerateRequest(**{**_fields(req), "prompt": req.prompt + MARK, "images": (vl["screen"],)}))
    np.testing.assert_array_equal(front.logits[0], marked.logits[0])
    assert not np.array_equal(front.logits[0], elsewhere.logits[0])


def _fields(req: GenerateRequest) -> dict:
    return {f: getattr(req, f) for f in req.__dataclass_fields__}


@pytest.mark.parametrize("mode", list(MODES))
def test_g18a_restored_prefix_with_an_image_equals_computed_in_the_same_pieces(
    open_session, vl: dict, mode: str
) -> None:
    img = (vl["screen"],)
    first = DecideRequest(id=1, prefix=MARK + P1, suffix=S2, choices=ABC, images=img)
    grown = DecideRequest(id=2, prefix=MARK + P2, suffix=S3, choices=ABC, images=img)
    agent = _open(open_session, vl, mode)
    a1 = agent.decide(first)
    encoded = agent.runtime.images.n_encoded
    a2 = agent.decide(grown)  # restores the kept prefix (image included), stores the grown one
    a3 = agent.decide(grown)  # restores it exactly
    assert (a1.reuse, a2.reuse, a3.reuse) == ("stored", "restored+stored", "restored")
    assert agent.runtime.images.n_encoded == encoded  # the kept image was not encoded again
    fresh = _open(open_session, vl, mode).decide(grown)  # the same pieces: prefix stored, then the rest
    assert fresh.reuse == "stored"
    assert _scores(a3) == _scores(fresh)
    if mode != "resident":
        ref = _open(open_session, vl, "resident")
        assert _scores(ref.decide(first)) == _scores(a1)
        assert _scores(ref.decide(grown)) == _scores(a2)


def _run_with_images(s, vl: dict) -> tuple:
    """A generation over an image and a decision whose prefix holds one: what G3 and G4 compare
    (tokens, logit rows as lists, so == is bit for bit, and the decision's scores)."""
    img = (vl["screen"],)
    g = s.generate(GenerateRequest(prompt="What is on the screen?", images=img, n_predict=12, keep_logits=True))
    d = s.decide(DecideRequest(id=1, prefix=MARK + P1, suffix=S2, choices=ABC, images=img))
    return g.tokens, [x.tolist() for x in g.logits], _scores(d)


def test_g3_reading_every_expert_with_an_image_equals_resident(open_session, vl: dict) -> None:
    ref = _run_with_images(_open(open_session, vl, "resident"), vl)
    s = _open(open_session, vl, "resident", moe_stream=True, stream_read_all=True)
    routes = record_routes(s)
    got = _run_with_images(s, vl)
    assert got == ref and len(got[1]) == 12
    assert s.stream_stats().routed == len(routes) * s.streaming.layout.n_expert


def test_g4_warm_with_an_image_equals_cold_and_reads_nothing(open_session, vl: dict) -> None:
    ref = _run_with_images(_open(open_session, vl, "resident"), vl)
    s = _open(open_session, vl, "resident", moe_stream=True, cache_mb=64)
    cold = _run_with_images(s, vl)
    before = s.stream_stats()
    warm = _run_with_images(s, vl)
    after = s.stream_stats()
    assert cold == ref and warm == cold
    assert after.routed > before.routed and after.hits - before.hits == after.routed - before.routed
    assert after.read_bytes == before.read_bytes


@pytest.mark.parametrize("mode", ["resident", "stream-evicting"])
def test_an_image_in_the_suffix_and_a_batch_over_an_image_prefix(open_session, vl: dict, mode: str) -> None:
    in_suffix = [
        DecideRequest(id=0, prefix=P1, suffix=f" Screen: {MARK}" + s, choices=ABC, images=(im,))
        for s, im in ((S2, vl["screen"]), (S3, vl["other"]))
    ]
    shared = [DecideRequest(id=0, prefix=MARK + P1, suffix=s, choices=ABC, images=(vl["screen"],)) for s in (S2, S3)]
    one = _open(open_session, vl, mode, decide_batch=4)
    alone = [one.decide(r) for r in in_suffix + shared]
    assert [r.reuse for r in alone[:2]] == ["stored", "restored"]  # the image is past the kept prefix
    many = _open(open_session, vl, mode, decide_batch=4).decide_many(in_suffix + shared)
    assert many[3].batch is not None and many[3].batch.size == 2  # the shared image prefix was batched
    assert [_scores(r) for r in many] == [_scores(r) for r in alone]
    if mode != "resident":
        ref = _open(open_session, vl, "resident", decide_batch=4)
        assert [_scores(ref.decide(r)) for r in in_suffix + shared] == [_scores(r) for r in alone]


def test_bad_images_are_refusals_and_leave_the_session_as_it_was(open_session, vl: dict) -> None:
    d = vl["dir"]
    (d / "corrupt.png").write_bytes(Path(vl["screen"]).read_bytes()[:80])
    (d / "notes.png").write_text("not a picture")
    s = _open(open_session, vl, "stream-evicting")
    good = DecideRequest(id=1, prefix=MARK + P1, suffix=S2, choices=ABC, images=(vl["screen"],))
    before = s.decide(good)
    data_url = "data:image/png;base64," + base64.b64encode(Path(vl["screen"]).read_bytes()).decode()
    cases = {
        str(d / "missing.png"): "file not found",
        str(d / "corrupt.png"): "is corrupt",
        str(d / "notes.png"): "is not an image",
        str(d): "is a folder",
        "data:image/png;base64,@@@": "does not decode",
        "https://example.com/a.png": "is a remote URL; bmoe does no network fetches",
        "DATA:/../a.png": "is a data: URL that is not base64",
        vl["big"]: "768 of them its images'",
    }
    for source, words in cases.items():
        r = s.decide(DecideRequest(id=2, prefix=P1, suffix=S2, choices=ABC, images=(source,)))
        assert r.error is not None and words in r.error and r.refused, (source, r.error)
        with pytest.raises(RequestError, match=words.split("'")[0]):
            s.generate(GenerateRequest(prompt="hi", images=(source,), n_predict=1))
    two = s.decide(DecideRequest(id=3, prefix=MARK + P1, suffix=S2, choices=ABC, images=(vl["screen"], vl["other"])))
    assert two.refused and "2 image(s) but the prompt has 1 image marker(s)" in two.error
    ok = s.decide(DecideRequest(id=4, prefix=P1, suffix=S2, choices=ABC, images=(data_url,)))
    assert ok.error is None
    after = s.decide(good)
    assert after.reuse in ("stored", "restored") and _scores(after) == _scores(before)


def test_images_without_mmproj_are_refused(open_session, vl: dict) -> None:
    s = open_session(vl["model"], chat="chatml", decide=True)
    r = s.decide(DecideRequest(id=1, prefix=P1, suffix=S2, choices=ABC, images=(vl["screen"],)))
    assert r.refused and "no vision projector; open it with --mmproj" in r.error
    with pytest.raises(RequestError, match="--mmproj"):
        s.generate(GenerateRequest(prompt="hi", images=(vl["screen"],), n_predict=1))


def test_an_mmproj_for_another_model_is_refused_at_open(open_session, vl: dict, tiny_dir: Path) -> None:
    other = write_tiny("qwen3moe", "q8_0", tiny_dir)  # n_embd 256: the projector gives 64 (+64 deepstack)
    with pytest.raises(ModelFileError, match="does not match the model") as exc:
        open_session(other, mmproj=vl["mmproj"])
    assert "\n" not in str(exc.value) and str(other) in str(exc.value)
    with pytest.raises(ModelFileError, match="not a GGUF"):
        open_session(vl["model"], mmproj=Path(vl["screen"]))
    with pytest.raises(ConfigError, match="mmproj: file not found"):
        open_session(vl["model"], mmproj=vl["dir"] / "none.gguf")


def test_a_continued_conversation_keeps_its_images(open_session, vl: dict) -> None:
    """clear_kv false after a turn over an image: the history's image is read again, stands as the
    same placeholder run, and its KV is reused; the next turn may bring an image of its own; the
    same conversation computed whole gives the same tokens."""
    s = _open(open_session, vl, "stream-evicting")
    first = s.generate(GenerateRequest(prompt="What is on the screen?", images=(vl["screen"],), n_predict=3))
    encoded = s.runtime.images.n_encoded
    second = s.generate(
        GenerateRequest(prompt="And here?", images=(vl["other"],), n_predict=3, clear_kv=False, keep_logits=True)
    )
    assert second.n_reused >= first.n_prompt  # the first turn, its image included, was not prefilled again
    assert s.runtime.images.n_encoded == encoded + 1  # only the new image was encoded
    assert [m.images for m in s.history] == [(vl["screen"],), (), (vl["other"],), ()]
    whole = _open(open_session, vl, "resident")
    whole.set_history(s.history[:2])
    again = whole.generate(
        GenerateRequest(prompt="And here?", images=(vl["other"],), n_predict=3, clear_kv=False, keep_logits=True)
    )
    assert again.tokens == second.tokens
    # a history message whose markers are not its images is refused, the session unchanged
    s.set_history([Message("user", "a " + MARK), Message("assistant", "ok")])
    with pytest.raises(RequestError, match="message 0 \\(user\\) holds 1 image marker"):
        s.generate(GenerateRequest(prompt="hi", images=(vl["screen"],), n_predict=1, clear_kv=False))
