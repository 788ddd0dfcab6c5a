"""One tiny model's recipe: its name, variant, what it stands for, and how it is built.

The table of all recipes is recipes.py; what each field means and why each recipe is shaped as it
is: docs/tiny-models.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bmoe.testing.spec import TinySpec

# How a recipe is built and which checks take it (docs/tiny-models.md#the-recipe-table).
HAND_WRITTEN = "hand-written"  # written by gguf from numpy weights (spec.py, writer.py)
CONVERTED = "converted"  # built by transformers, converted by llama.cpp; the text gates run on it
VISION_LANGUAGE = "vision-language"  # converted; only the image tests: a converted recipe has its arch
K_QUANT = "k-quant"  # converted, 256 wide, so its experts hold K-quants; only the K-quant gates (G23)
VARIANTS = (HAND_WRITTEN, CONVERTED, VISION_LANGUAGE, K_QUANT)

VOCAB = 49152  # SmolLM2's vocabulary, which every recipe shares
# What the converted recipes share: two layers, 64 wide, SmolLM2's vocabulary, a wide init.
SMALL_CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "initializer_range": 0.1,
}

# The attention/state families the recipes fall in (Recipe.family): the whole gate set runs on one
# architecture of each, the core gates on the rest (docs/testing.md).
FAMILIES: dict[str, str] = {
    "attention": "full softmax attention over a KV cache (GQA, biases, q/k norms, partial RoPE)",
    "mla": "multi-head latent attention (a compressed KV cache)",
    "sliding-window": "sliding-window layers beside full-attention ones (iSWA)",
    "chunked": "chunked attention layers and a NoPE layer",
    "deltanet": "gated DeltaNet linear attention beside full attention (recurrent state)",
    "mamba": "Mamba (Mamba1, selective scan) layers beside attention (recurrent state)",
    "mamba2": "Mamba2 layers beside attention (recurrent state)",
    "kda": "Kimi delta attention (gated DeltaNet with a per-channel decay) beside MLA (recurrent state)",
    "short-conv": "short-convolution layers beside attention (recurrent state)",
    "msa": "block-sparse attention whose key blocks an indexer picks (MiniMax sparse attention)",
    "csa": "DeepSeek-V4's compressed attention (sliding-window, CSA and HCA layers, a lightning indexer) "
    "over hyper-connection residual streams",
    "dsa": "multi-head latent attention whose DSA lightning indexer picks the past tokens each query attends",
    "kda-dsa": "KDA linear attention (recurrent state) beside NoPE MLA layers with a pooled DSA indexer, "
    "over mHC residual streams",
    "lightning": "lightning attention: linear attention with a per-head decay (recurrent state)",
}


@dataclass(frozen=True, slots=True)
class Fixups:
    """One-off changes to a converted recipe's model or saved folder, so that it holds what the real
    checkpoints hold and the converter reads (hf_convert.write_hf_model applies them in turn)."""

    random_init: tuple[str, ...] = ()  # tensors (name suffixes) transformers starts at a constant: seeded normal
    random_init_std: float | None = None  # their spread (None: the config's initializer_range)
    mtp_layers: int = 0  # NextN blocks after the last layer (hf_mtp.py)
    converter_args: tuple[str, ...] = ()  # extra convert_hf_to_gguf.py options
    saved_config: dict[str, Any] = field(default_factory=dict)  # keys rewritten in the saved config.json
    checkpoint_transpose: tuple[str, ...] = ()  # saved tensors whose last two dims are swapped
    checkpoint_rename: tuple[tuple[str, str], ...] = ()  # (regex, replacement) over saved tensor names
    checkpoint_drop: tuple[str, ...] = ()  # saved buffers removed
    checkpoint_index: bool = False  # write model.safetensors.index.json beside the one shard
    checkpoint: str | None = None  # a real layout written for the converter (hf_convert.CHECKPOINTS)


@dataclass(frozen=True, slots=True)
class Recipe:
    """One tiny model: files ``tiny-<name>-<quant>.gguf`` (and, converted, the folder ``hf-<name>``)."""

    name: str
    variant: str  # one of VARIANTS
    arch: str  # general.architecture of the file
    model_type: str  # transformers' model_type
    seed: int
    real_models: str  # the real models it stands for
    quants: tuple[str, ...] = ("q8_0",)  # the quantizations its gates run on, besides the f32 file
    family: str = "attention"  # a key of FAMILIES
    config: dict[str, Any] = field(default_factory=dict)  # converted: the tiny config, over SMALL_CONFIG
    tokenizer: str = "smollm"  # hf_tokenizer.write_hf_tokenizer's kind
    special_tokens: tuple[str, ...] = ()  # appended after SmolLM2's vocabulary (ids 49152, ...)
    outer_config: dict[str, Any] | None = None  # a composite model: these keys, the text config under text_config
    auto_class: str = "AutoModelForCausalLM"  # the transformers class that builds and loads it
    preprocessor: dict[str, Any] | None = None  # image processor config: the recipe has a vision projector
    reference_config: dict[str, Any] = field(default_factory=dict)  # set on transformers' side only
    parity_tol: float = 1e-3  # bound of max |d log-softmax| against transformers (F32)
    fix: Fixups = Fixups()
    spec: TinySpec | None = None  # hand-written: the shapes

    def hf_config(self) -> dict[str, Any]:
        text = {**SMALL_CONFIG, **self.config}
        return text if self.outer_config is None else {**self.outer_config, "text_config": text}


# The fields a converted recipe's hash covers, as the recipe record spelled them when the hash was
# first taken: cached models stay current while these are unchanged (hf_convert._recipe).
_HASHED = (
    "arch",
    "model_type",
    "config",
    "seed",
    "real_models",
    "quants",
    "reference_config",
    "parity_tol",
    "special_tokens",
    "tokenizer",
    "outer_config",
    "auto_class",
    "family",
    "preprocessor",
)


def hashed_fields(r: Recipe) -> dict[str, Any]:
    """The recipe as its hash sees it: the recipe's fields and the fix-ups' side by side, without the
    name and variant (the file name carries those) or, where the recipe has no projector, the
    preprocessor (recipes hashed as before it existed)."""
    fields: dict[str, Any] = {k: getattr(r, k) for k in _HASHED}
    fields.update({k: getattr(r.fix, k) for k in Fixups.__dataclass_fields__})
    if fields["preprocessor"] is None:
        del fields["preprocessor"]
    return fields
