"""--n-expert-used K on the tiny models: the override takes effect, the bytes read per decoded token
fall with K exactly as the layout says, what the model does not allow is refused when the session
opens (before anything loads), and BMOE_READY names K. Resident and streamed with the same K agree
bit for bit: gate G22, tests/gates/test_n_expert_used_exact.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from bmoe.cli.loop import run_session
from bmoe.config import SessionConfig
from bmoe.errors import ConfigError
from bmoe.flags import opening_failure
from bmoe.runtime.results import GenerateRequest
from bmoe.session import Session

GEN = GenerateRequest(prompt="Tell me about the sea and the ships on it.", n_predict=8, keep_logits=True)


def test_k_changes_what_the_resident_model_computes(open_tiny) -> None:
    own, narrowed = open_tiny("qwen3moe"), open_tiny("qwen3moe", n_expert_used=1)
    assert (own.model.n_expert_used, own.model.n_expert_used_gguf) == (2, 2)
    assert (narrowed.model.n_expert_used, narrowed.model.n_expert_used_gguf) == (1, 2)
    a, b = own.generate(GEN), narrowed.generate(GEN)
    assert not np.array_equal(a.logits[0], b.logits[0])  # the first row already: the prompt routed differently
    # K equal to the model's own is the model's own, bit for bit
    same = open_tiny("qwen3moe", n_expert_used=2).generate(GEN)
    assert same.tokens == a.tokens and all(np.array_equal(x, y) for x, y in zip(same.logits, a.logits, strict=True))


def _decode_bytes_per_token(s: Session) -> float:
    r = s.generate(GEN)
    # every generated token but the last is decoded (one more llama_decode each) unless it ended the turn
    n_decoded = len(r.tokens) - (1 if r.stop in ("length", "ctx") else 0)
    assert n_decoded >= 4
    return r.decode_io.read_bytes / n_decoded


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_bytes_read_per_decoded_token_fall_in_proportion_to_k(open_tiny, tmp_path: Path, arch: str) -> None:
    """Cache off, no read-ahead: a decoded token reads exactly its K experts in every MoE layer
    (top-k ids are distinct), which is the layout's floor; so K=1 reads 1/n_expert_used of it."""
    own = open_tiny(arch, moe_stream=True, twin_dir=tmp_path)
    one = open_tiny(arch, moe_stream=True, twin_dir=tmp_path, n_expert_used=1)
    k_own = own.streaming.layout.n_expert_used
    assert k_own == {"qwen3moe": 2, "qwen35moe": 4}[arch] and one.streaming.layout.n_expert_used == 1
    per_own, per_one = _decode_bytes_per_token(own), _decode_bytes_per_token(one)
    layout = one.streaming.layout
    one_expert_each = sum(layout.expert_nbytes_in_layer(il) for il in layout.layers)
    assert per_one == one.streaming.layout.floor_bytes() == one_expert_each
    assert per_own == own.streaming.layout.floor_bytes() == k_own * one_expert_each
    assert per_one * k_own == per_own


def test_more_experts_than_the_model_has_is_refused_before_anything_loads(
    tiny_models, tmp_path: Path, monkeypatch
) -> None:
    """llama.cpp would stop the whole process on an assertion: the header says 16 experts first."""
    import bmoe.runtime.runtime as runtime_mod

    def never(*a: object, **kw: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(runtime_mod, "LlamaModel", never)
    monkeypatch.setattr(runtime_mod, "open_streaming", never)
    model = tiny_models("qwen3moe", "q8_0")
    for stream in (False, True):
        kw = dict(moe_stream=True, twin_dir=tmp_path / "twins") if stream else {}
        cfg = SessionConfig(model=model, n_ctx=256, n_threads=1, n_expert_used=17, **kw)  # the config takes it
        with pytest.raises(ConfigError) as e:
            Session(cfg)
        assert str(e.value) == "n_expert_used: 17 is more than the model's 16 experts (qwen3moe.expert_count)"
        assert opening_failure(e.value) == (
            "--n-expert-used (n_expert_used): 17 is more than the model's 16 experts (qwen3moe.expert_count)"
        )
    assert not (tmp_path / "twins").exists()  # no dense twin written either


def test_all_of_the_model_s_experts_is_allowed(open_tiny) -> None:
    s = open_tiny("qwen3moe", n_expert_used=16)
    assert s.model.n_expert_used == 16 and s.generate(GenerateRequest(prompt="Hi", n_predict=2)).tokens


def test_a_dense_model_is_refused_naming_that_it_has_no_experts(monkeypatch) -> None:
    import bmoe.runtime.runtime as runtime_mod
    from bmoe.testing.smollm2 import smollm2_gguf_path

    def never(*a: object, **kw: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(runtime_mod, "LlamaModel", never)
    with pytest.raises(ConfigError) as e:
        Session(SessionConfig(model=smollm2_gguf_path(), n_expert_used=1))
    assert str(e.value) == (
        "n_expert_used: the model has no experts (llama.expert_count is not set): it is a dense "
        "model, with no experts per token to change"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_ready_says_k_and_the_model_s_own(open_tiny, tmp_path: Path, stream: bool) -> None:
    kw = dict(moe_stream=True, twin_dir=tmp_path) if stream else {}
    s = open_tiny("qwen35moe", n_expert_used=3, **kw)
    out = io.StringIO()
    assert run_session(s, io.StringIO('{"cmd":"close"}\n'), out) == 0
    tag, _, body = out.getvalue().splitlines()[0].partition(" ")
    ready = json.loads(body)
    assert tag == "BMOE_READY" and (ready["n_expert_used"], ready["n_expert_used_gguf"]) == (3, 4)
    assert ready["streaming"] is stream
