"""Shapes of the tiny random-weight MoE fixtures.

The numbers are chosen, not tuned: every matrix whose rows llama.cpp may K-quantize has a row
length of 256 (one K-quant super-block), so Q4_K_M really produces Q4_K/Q6_K expert tensors;
the vocabulary is SmolLM2's (49152) because the tokenizer is copied from its GGUF; embeddings
are tied so the F32 file stays near 100 MB.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf

QUANTS = ("f32", "q8_0", "q4_k_m")
# Variants llama.cpp's quantizer makes from the F32 file (gguf cannot write K-quants or i-quants),
# by the LLAMA_FTYPE_MOSTLY_* name it is asked for. "q6_k" and "iq4_xs" are only for the K-quant
# gates (G23): QUANTS is what every tiny-model check and `--all` go over.
QUANTIZED = {"q4_k_m": "Q4_K_M", "q6_k": "Q6_K", "iq4_xs": "IQ4_XS"}
ALL_QUANTS = (*QUANTS, *(q for q in QUANTIZED if q not in QUANTS))

# Bumped whenever the weights or metadata a spec produces change, so cached files are rewritten.
RECIPE_VERSION = 1


@dataclass(frozen=True, slots=True)
class LinearAttnDims:
    """Gated-DeltaNet sizes (HF names). More value heads than key heads, as in Qwen3.6-35B-A3B,
    so the converter's grouped-to-tiled V-head reorder is exercised."""

    n_k_heads: int = 2
    n_v_heads: int = 4
    head_k_dim: int = 32
    head_v_dim: int = 32
    conv_kernel: int = 4

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True, slots=True)
class TinySpec:
    arch: str
    seed: int
    n_vocab: int = 49152
    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_expert: int = 16
    n_expert_used: int = 2
    n_ff_exp: int = 256
    n_ff_shexp: int = 0  # 0: no shared expert
    n_ctx_train: int = 8192
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    partial_rotary: float = 1.0
    mrope_section: tuple[int, ...] = ()
    # One entry per layer: "full_attention" or "linear_attention" (HF's layer_types spelling).
    layer_types: tuple[str, ...] = ("full_attention",) * 4
    linear: LinearAttnDims | None = None

    @property
    def n_rot(self) -> int:
        return int(self.head_dim * self.partial_rotary)

    @property
    def flavour(self) -> Flavour:
        return FLAVOURS[self.arch]


@dataclass(frozen=True, slots=True)
class Flavour:
    """What the two hand-written architectures do differently beyond their shapes: the rules the
    weights, the tensor conversion and the metadata follow (weights.py, convert.py, writer.py). Not
    part of the recipe hash: the arch, which the hash covers, picks it."""

    model_type: str  # transformers' model_type
    zero_centred_norms: bool  # RMSNorm computes x * (1 + w): neutral weight 0, and the converter adds 1
    gated_attention: bool  # q_proj yields [query, gate] per head
    post_attention_norm: gguf.MODEL_TENSOR  # the GGUF name of the norm between attention and the FFN
    dense_ffn_length: bool  # the loader reads feed_forward_length (the experts' width x the used count)


FLAVOURS = {
    "qwen3moe": Flavour(
        "qwen3_moe",
        zero_centred_norms=False,
        gated_attention=False,
        post_attention_norm=gguf.MODEL_TENSOR.FFN_NORM,
        dense_ffn_length=True,
    ),
    "qwen35moe": Flavour(
        "qwen3_5_moe_text",
        zero_centred_norms=True,
        gated_attention=True,
        post_attention_norm=gguf.MODEL_TENSOR.ATTN_POST_NORM,
        dense_ffn_length=False,
    ),
}


QWEN3MOE = TinySpec(arch="qwen3moe", seed=3)

QWEN35MOE = TinySpec(
    arch="qwen35moe",
    seed=35,
    n_expert_used=4,
    n_ff_shexp=256,
    rope_theta=10_000_000.0,
    partial_rotary=0.25,
    # Sums to n_rot / 2 = 8 rotary pairs; text positions are equal on all axes, so the split only
    # has to be valid, not meaningful.
    mrope_section=(3, 3, 2),
    layer_types=("linear_attention", "full_attention", "linear_attention", "full_attention"),
    linear=LinearAttnDims(),
)

SPECS: dict[str, TinySpec] = {s.arch: s for s in (QWEN3MOE, QWEN35MOE)}


def spec_for(arch: str) -> TinySpec:
    try:
        return SPECS[arch]
    except KeyError:
        raise ValueError(f"unknown tiny arch {arch!r}; choose one of {', '.join(SPECS)}") from None


def expert_slice_bytes(spec: TinySpec, ggml_type: gguf.GGMLQuantizationType) -> int:
    """Bytes of one expert's slice of one stacked projection (gate, up or down are all
    n_embd x n_ff_exp here), i.e. ``nbytes(tensor) / n_expert`` for a tensor of that type."""
    block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
    n_elements = spec.n_embd * spec.n_ff_exp
    if n_elements % block:
        raise ValueError(f"{ggml_type.name} blocks of {block} do not tile {n_elements} elements")
    return n_elements // block * type_size
