"""bmoe.testing's one recipe table: every tiny model is one row, its variant says how it is built, and
the views the tests take are the table's rows of one variant (docs/tiny-models.md#the-recipe-table)."""

from pathlib import Path

import pytest

import bmoe.testing as T
from bmoe.testing import (
    ARCHS,
    FAMILIES,
    HF_ARCHS,
    HF_KQUANT_ARCHS,
    HF_VL_ARCHS,
    RECIPES,
    VARIANTS,
    VL_ARCHS,
    Fixups,
    Recipe,
    names,
    recipe,
    write_model,
)
from bmoe.testing.recipe import hashed_fields
from bmoe.testing.spec import SPECS

# The fields the converted recipes were hashed over when their cached models were made: a field
# moved, renamed or added changes every recipe hash and remakes every cached model.
LEGACY_HASHED = {
    "arch",
    "model_type",
    "config",
    "seed",
    "real_models",
    "quants",
    "reference_config",
    "parity_tol",
    "random_init",
    "special_tokens",
    "mtp_layers",
    "converter_args",
    "tokenizer",
    "saved_config",
    "outer_config",
    "auto_class",
    "checkpoint_transpose",
    "checkpoint_rename",
    "checkpoint_index",
    "checkpoint_drop",
    "random_init_std",
    "family",
    "preprocessor",
    "checkpoint",
}


def test_every_row_is_well_formed() -> None:
    assert set(VARIANTS) == {"hand-written", "converted", "vision-language", "k-quant"}
    seeds = [r.seed for r in RECIPES.values()]
    assert len(set(seeds)) == len(seeds), "two recipes share a seed"
    for name, r in RECIPES.items():
        assert isinstance(r, Recipe) and isinstance(r.fix, Fixups) and r.name == name
        assert r.variant in VARIANTS and r.family in FAMILIES, name
        assert r.model_type and r.real_models and r.quants, name
        if r.variant == "hand-written":
            assert r.spec is SPECS[name] and r.arch == name and r.seed == r.spec.seed, name
            assert r.model_type == r.spec.flavour.model_type and not r.config and r.fix == Fixups(), name
        else:
            assert r.spec is None and r.config, name
        if r.variant == "converted":
            assert r.arch == name, name  # one per architecture, named after it


def test_the_views_are_the_table_by_variant() -> None:
    assert ARCHS == ("qwen3moe", "qwen35moe") == names("hand-written")
    assert tuple(HF_ARCHS) == names("converted") and tuple(HF_VL_ARCHS) == ("glm4vmoe",)
    assert tuple(HF_KQUANT_ARCHS) == ("gpt-oss-w256", "deepseek2-w256", "gemma4-w256") == names("k-quant")
    assert sorted(names(*VARIANTS)) == sorted(RECIPES) == sorted([*ARCHS, *HF_ARCHS, *HF_VL_ARCHS, *HF_KQUANT_ARCHS])
    assert VL_ARCHS == ("qwen3vlmoe", "glm4vmoe")
    assert all(RECIPES[n].preprocessor is not None for n in VL_ARCHS)
    assert all(RECIPES[n].arch in HF_ARCHS for n in names("vision-language", "k-quant"))
    with pytest.raises(TypeError):
        HF_ARCHS["x"] = RECIPES["olmoe"]  # type: ignore[index]  # a view, not a second registry


def test_lookups_name_what_is_known() -> None:
    assert recipe("glm4vmoe") is HF_VL_ARCHS["glm4vmoe"] and T.hf_arch("olmoe") is RECIPES["olmoe"]
    with pytest.raises(ValueError, match=r"^no tiny recipe for 'glm4v'; known: afmoe, .*glm4vmoe, .*qwen3moe"):
        recipe("glm4v")
    with pytest.raises(ValueError, match=r"^no tiny HF recipe for 'qwen3moe'; known: afmoe, "):
        T.hf_arch("qwen3moe")  # hand-written: write_tiny's, not the converter's
    with pytest.raises(ValueError, match=r"^unknown recipe variant\(s\) \['vl'\]; known: hand-written, converted, "):
        names("vl")


def test_the_hash_sees_the_fields_it_always_saw() -> None:
    for name in names("converted", "vision-language", "k-quant"):
        r = RECIPES[name]
        want = LEGACY_HASHED if r.preprocessor is not None else LEGACY_HASHED - {"preprocessor"}
        assert set(hashed_fields(r)) == want, name
    r = RECIPES["minimax-01"]
    assert hashed_fields(r)["checkpoint_drop"] == r.fix.checkpoint_drop and hashed_fields(r)["checkpoint_index"]


def test_write_model_builds_each_variant_its_own_way(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = []
    monkeypatch.setattr(T, "write_tiny", lambda *a: calls.append(("gguf", *a)) or tmp_path)
    monkeypatch.setattr(T, "write_hf_arch", lambda *a: calls.append(("converter", *a)) or tmp_path)
    for name in ("qwen35moe", "olmoe", "glm4vmoe", "gemma4-w256"):
        write_model(name, "q8_0", tmp_path)
    assert calls == [
        ("gguf", "qwen35moe", "q8_0", tmp_path),
        ("converter", "olmoe", "q8_0", tmp_path),
        ("converter", "glm4vmoe", "q8_0", tmp_path),
        ("converter", "gemma4-w256", "q8_0", tmp_path),
    ]
    with pytest.raises(ValueError, match=r"^no tiny recipe for 'nope'"):
        write_model("nope", "q8_0", tmp_path)
