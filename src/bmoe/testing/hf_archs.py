"""Tiny models of real MoE architectures, made the way real GGUFs are made.

Each recipe is a small config of the real architecture. transformers builds the model from it with
random weights (seeded), and the pinned llama.cpp's own ``convert_hf_to_gguf.py`` converts it
(see hf_convert.py). The reference tests run transformers on the very same HF folder, so a
recipe proves both that llama.cpp computes the architecture and that bmoe streams it.

Shapes are as small as each architecture's loader allows; the vocabulary is SmolLM2's, whose
tokenizer every recipe shares (hf_tokenizer.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_VOCAB = 49152

# Fields most recipes share: two layers is enough to route twice per token; 64-wide rows are whole
# Q8_0 and MXFP4 blocks. Each recipe gives its MoE 32 experts of 128 (4 used): routes differ from
# token to token, and the Q8_0 experts (~1.7 MB) overflow the 1 MiB cache the eviction gate uses.
_SMALL: dict[str, Any] = {
    "vocab_size": _VOCAB,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    # A wider init than transformers' 0.02 so the routers' logits are far from ties and
    # the next-token distribution is not flat (both only make the checks sharper).
    "initializer_range": 0.1,
}


@dataclass(frozen=True, slots=True)
class HfArch:
    """One tiny model of a real architecture."""

    arch: str  # general.architecture the converter writes
    model_type: str  # transformers' model_type (AutoConfig.for_model)
    config: dict[str, Any]  # the tiny config, on top of _SMALL
    seed: int
    real_models: str  # what real models this stands for (docs/streaming.md's table)
    # Quantizations the gates run on: "q8_0" is written by the converter itself; anything else
    # ("q4_k_m", "mxfp4_moe") by llama.cpp's quantizer from the F32 file.
    quants: tuple[str, ...] = ("q8_0",)
    # Config changes on the reference (transformers) side only, each for a documented rounding
    # or rule of llama.cpp that the reference reproduces instead of loosening the bound.
    reference_config: dict[str, Any] = field(default_factory=dict)
    # Parity bound for max |d log-softmax| between llama.cpp (F32) and transformers.
    parity_tol: float = 1e-3

    def hf_config(self) -> dict[str, Any]:
        return {**_SMALL, **self.config}


def _arch(arch: str, model_type: str, seed: int, real_models: str, **kw: Any) -> HfArch:
    return HfArch(arch=arch, model_type=model_type, seed=seed, real_models=real_models, **kw)


HF_ARCHS: dict[str, HfArch] = {
    a.arch: a
    for a in (
        _arch("olmoe", "olmoe", 101, "OLMoE-1B-7B",
              # llama.cpp's OLMoE q/k norms span all heads: n_head_kv must equal n_head.
              config={"intermediate_size": 128, "num_experts": 32, "num_experts_per_tok": 4}),
        _arch("qwen2moe", "qwen2_moe", 102, "Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B",
              config={"intermediate_size": 128, "moe_intermediate_size": 128,
                      "shared_expert_intermediate_size": 128, "num_experts": 32,
                      "num_experts_per_tok": 4, "num_key_value_heads": 2, "decoder_sparse_step": 1,
                      "mlp_only_layers": []}),
        # -- group A: gpt-oss, lfm2moe, granite --
        # -- group B: gemma4, mixtral, qwen3next --
        # -- group C: deepseek2, glm4moe, then the stretch list --
    )
}


def hf_arch(arch: str) -> HfArch:
    try:
        return HF_ARCHS[arch]
    except KeyError:
        raise ValueError(f"no tiny HF recipe for {arch!r}; known: {', '.join(sorted(HF_ARCHS))}") from None
