"""Deterministic tiny random-weight MoE GGUFs for tests, gates and benchmarks.

Every tiny model is one recipe of ``RECIPES`` (recipes.py); ``write_model(name, quant, out_dir)``
returns its cached file, whatever its variant. ``hf_weights_for(arch)`` gives a hand-written
model's weights in Hugging Face form for the transformers reference test. The command
``python -m bmoe.testing --all --out DIR`` writes the hand-written ones. See docs/tiny-models.md.
"""

from __future__ import annotations

from pathlib import Path

from bmoe.testing.hf_convert import hf_dir, load_reference, write_hf_arch, write_hf_mmproj
from bmoe.testing.images import png_bytes, write_png
from bmoe.testing.recipe import FAMILIES, VARIANTS, Fixups, Recipe
from bmoe.testing.recipes import (
    ARCHS,
    HF_ARCHS,
    HF_KQUANT_ARCHS,
    HF_VL_ARCHS,
    RECIPES,
    VL_ARCHS,
    hf_arch,
    names,
    recipe,
)
from bmoe.testing.smollm2 import SmolLM2NotInstalled, smollm2_gguf_path
from bmoe.testing.spec import QUANTS, TinySpec, expert_slice_bytes, spec_for
from bmoe.testing.weights import HfWeights, hf_weights
from bmoe.testing.writer import default_tiny_dir, tiny_file_name, write_tiny, write_tiny_split


def hf_weights_for(arch: str) -> HfWeights:
    """The random weights of the tiny ``arch`` fixture as an HF config + state dict."""
    return hf_weights(spec_for(arch))


def write_model(name: str, quant: str, out_dir: Path) -> Path:
    """The tiny model of recipe ``name`` in ``quant`` under ``out_dir``, made when missing or stale:
    by gguf for a hand-written recipe, by transformers and llama.cpp's converter otherwise."""
    if recipe(name).spec is not None:
        return write_tiny(name, quant, out_dir)
    return write_hf_arch(name, quant, out_dir)


__all__ = [
    "ARCHS",
    "FAMILIES",
    "HF_ARCHS",
    "HF_KQUANT_ARCHS",
    "HF_VL_ARCHS",
    "RECIPES",
    "VARIANTS",
    "Fixups",
    "Recipe",
    "hf_arch",
    "hf_dir",
    "load_reference",
    "names",
    "recipe",
    "write_hf_arch",
    "write_hf_mmproj",
    "write_model",
    "png_bytes",
    "write_png",
    "QUANTS",
    "HfWeights",
    "SmolLM2NotInstalled",
    "TinySpec",
    "VL_ARCHS",
    "default_tiny_dir",
    "expert_slice_bytes",
    "hf_weights_for",
    "smollm2_gguf_path",
    "spec_for",
    "tiny_file_name",
    "write_tiny",
    "write_tiny_split",
]
