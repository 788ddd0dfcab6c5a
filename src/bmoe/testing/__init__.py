"""Deterministic tiny random-weight MoE GGUFs for tests, gates and benchmarks.

``write_tiny("qwen3moe", "q4_k_m", out_dir)`` returns a cached file; ``hf_weights_for(arch)``
gives the same weights in Hugging Face form for the transformers reference test. The command
``python -m bmoe.testing --all --out DIR`` writes every variant. See docs/tiny-models.md.
"""
from __future__ import annotations

from bmoe.testing.hf_archs import FAMILIES, HF_ARCHS, HF_KQUANT_ARCHS, HF_VL_ARCHS, VL_ARCHS, HfArch, hf_arch
from bmoe.testing.hf_convert import hf_dir, load_reference, write_hf_arch, write_hf_mmproj
from bmoe.testing.images import png_bytes, write_png
from bmoe.testing.smollm2 import SmolLM2NotInstalled, smollm2_gguf_path
from bmoe.testing.spec import ARCHS, QUANTS, TinySpec, expert_slice_bytes, spec_for
from bmoe.testing.weights import HfWeights, hf_weights
from bmoe.testing.writer import default_tiny_dir, tiny_file_name, write_tiny, write_tiny_split


def hf_weights_for(arch: str) -> HfWeights:
    """The random weights of the tiny ``arch`` fixture as an HF config + state dict."""
    return hf_weights(spec_for(arch))


__all__ = [
    "ARCHS",
    "FAMILIES",
    "HF_ARCHS",
    "HF_KQUANT_ARCHS",
    "HF_VL_ARCHS",
    "HfArch",
    "hf_arch",
    "hf_dir",
    "load_reference",
    "write_hf_arch",
    "write_hf_mmproj",
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
