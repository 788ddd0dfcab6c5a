"""Tiny models of real MoE architectures, made the way real GGUFs are made.

Each recipe is a small config of the real architecture. transformers builds the model from it with
random weights (seeded), and the pinned llama.cpp's own ``convert_hf_to_gguf.py`` converts it
(see hf_convert.py). The reference tests run transformers on the very same HF folder, so a
recipe proves both that llama.cpp computes the architecture and that bmoe streams it.

Shapes are as small as each architecture's loader allows; the vocabulary is SmolLM2's, whose
tokenizer every recipe shares (hf_tokenizer.py). HF_KQUANT_ARCHS holds 256-wide variants of some of
them, whose experts can hold K-quants, for the K-quant gates (G23).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bmoe.testing.ggml_rounding import EXPERTS_Q8_0, GELU_FP16

_VOCAB = 49152
# The "spm" tokenizer's byte pieces SmolLM2 has no <0xXX> token for, after its ids
# (hf_tokenizer._write_spm_model checks the count).
SPM_BYTE_PIECES = 143
# Qwen-VL's vision tokens, in the order of their config ids (vision_start_token_id, ...).
QWEN_VL_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

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


# The attention/state families the recipes fall in, by what their layers keep between tokens and
# how attention sees the past. A recipe names its own (HfArch.family).
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
class HfArch:
    """One tiny model of a real architecture."""

    arch: str  # general.architecture the converter writes
    model_type: str  # transformers' model_type (AutoConfig.for_model)
    config: dict[str, Any]  # the tiny config, on top of _SMALL
    seed: int
    real_models: str  # what real models this stands for (docs/streaming.md's table)
    # Quantizations the gates run on: "q8_0" is written by the converter itself; anything else
    # ("q4_k_m", "q6_k", "iq4_xs", "mxfp4_moe") by llama.cpp's quantizer from the F32 file.
    quants: tuple[str, ...] = ("q8_0",)
    # Config changes on the reference (transformers) side only, each for a documented rounding
    # or rule of llama.cpp that the reference reproduces instead of loosening the bound.
    reference_config: dict[str, Any] = field(default_factory=dict)
    # Parity bound for max |d log-softmax| between llama.cpp (F32) and transformers.
    parity_tol: float = 1e-3
    # Parameters or buffers (name suffixes) that transformers starts at a constant, e.g. a zero
    # routing bias, and the recipe fills with seeded N(0, initializer_range) values instead, so
    # the path they feed is exercised (hf_convert.write_hf_model).
    random_init: tuple[str, ...] = ()
    # Special tokens appended to SmolLM2's tokenizer (ids from 49152 on; the config's vocab_size
    # must cover them), for a converter that looks up its architecture's own tokens by name.
    special_tokens: tuple[str, ...] = ()
    # Multi-token-prediction (NextN) blocks after the last layer, as the real checkpoints carry
    # them and the converter writes them (hf_mtp.py); llama.cpp's trunk never computes them.
    mtp_layers: int = 0
    # Extra options to convert_hf_to_gguf.py, e.g. "--no-mtp" for a model the converter expects
    # to carry multi-token-prediction weights that transformers does not build.
    converter_args: tuple[str, ...] = ()
    # The tokenizer's form (hf_tokenizer.write_hf_tokenizer): "smollm", SmolLM2's own byte-level
    # BPE, or "spm-bpe", the same vocabulary as a Llama-style byte-fallback BPE.
    tokenizer: str = "smollm"
    # Keys of the saved config.json rewritten after transformers writes it, where the converter
    # reads a spelling the real checkpoints carry and transformers no longer writes (it reads
    # both), e.g. Granite 4's legacy layer_types "mamba"/"attention". A "model_type" here is one
    # transformers does not know (a remote-code checkpoint's): the converter then reads
    # config.json as written, and the reference (load_reference) builds the recipe's model_type
    # from the saved keys.
    saved_config: dict[str, Any] = field(default_factory=dict)
    # A composite (vision-language) model whose language model is the MoE: the tiny text config
    # (_SMALL and ``config``) goes under "text_config", beside these top-level keys (a tiny
    # vision_config, ...). None: a plain causal LM config.
    outer_config: dict[str, Any] | None = None
    # The transformers auto class that builds and loads the model (a composite model has no
    # AutoModelForCausalLM entry).
    auto_class: str = "AutoModelForCausalLM"
    # Saved tensors (name suffixes) whose last two dims are swapped after save_pretrained: where
    # transformers keeps a layout of its own in memory and writes it as is, but the real
    # checkpoints (which the converter reads) hold the other one and transformers' loader
    # transposes them on load (its conversion mapping, which checks the shapes): so the folder
    # holds what a real one holds, and both sides read it.
    checkpoint_transpose: tuple[str, ...] = ()
    # Saved tensor names rewritten after save_pretrained, (regex, replacement) pairs applied in turn
    # (re.sub): where transformers' save reverses its load-time renames into names its own loader
    # reads back but the real checkpoints, which the converter reads, spell otherwise.
    checkpoint_rename: tuple[tuple[str, str], ...] = ()
    # Write model.safetensors.index.json (the weight map) beside the one shard, as the real,
    # many-shard checkpoints carry it, for a converter that opens it (MiniMax-Text-01's).
    checkpoint_index: bool = False
    # Saved tensors (name suffixes) removed after save_pretrained: buffers transformers saves but
    # the real checkpoints do not hold and its loader recomputes when they are missing (MiniMax's
    # lightning-attention decays), which the converter has no name for.
    checkpoint_drop: tuple[str, ...] = ()
    # The standard deviation ``random_init`` fills with (None: the config's initializer_range), for
    # a bias that must stay on the scale of what it is added to (softmax probabilities) so the pick
    # still follows the router.
    random_init_std: float | None = None
    # The kind of token mixing its layers do besides the MoE (a key of FAMILIES). The whole gate set
    # runs on one architecture of each family, the core gates on the rest (docs/testing.md).
    family: str = "attention"
    # A vision-language recipe's image processor config (preprocessor_config.json in the HF folder):
    # what the converter's --mmproj output reads its image size and normalisation from
    # (hf_convert.write_hf_mmproj), and transformers' image processor too. None: no projector.
    preprocessor: dict[str, Any] | None = None
    # The real checkpoint layout the converter reads, where it reads only that one and
    # save_pretrained writes another: a key of hf_convert.CHECKPOINTS, whose module adjusts the
    # model before it is saved and writes the saved folder in that layout for the converter
    # (the HF folder stays as transformers wrote it, for the reference). "deepseek4":
    # DeepSeek-V4's own names with MXFP4-packed routed experts (hf_deepseek4.py).
    checkpoint: str | None = None

    def hf_config(self) -> dict[str, Any]:
        text = {**_SMALL, **self.config}
        return text if self.outer_config is None else {**self.outer_config, "text_config": text}


def _arch(arch: str, model_type: str, seed: int, real_models: str, **kw: Any) -> HfArch:
    return HfArch(arch=arch, model_type=model_type, seed=seed, real_models=real_models, **kw)


# MiMo-V2-Flash's RoPE per layer type, as transformers holds it.
_MIMO2_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.334},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.334}}

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
        # gpt-oss: the experts stay unquantized in the HF folder (the converter only warns), and
        # llama.cpp's quantizer writes the MXFP4 the real models ship in. head_dim must be given
        # (its default is 64 whatever the width). An 8-token sliding window on every other layer
        # makes the parity prompt cross it. llama.cpp always rounds YaRN's correction range
        # (transformers' truncate=True); the real config says False, so the reference says True.
        # Experts of 192: at 128 the MXFP4 experts (0.8 MB) would fit the eviction gate's 1 MiB.
        _arch("gpt-oss", "gpt_oss", 103, "gpt-oss-20b, gpt-oss-120b",
              config={"intermediate_size": 192, "num_local_experts": 32, "num_experts_per_tok": 4,
                      "head_dim": 16, "num_key_value_heads": 2, "sliding_window": 8,
                      "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                          "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                          "original_max_position_embeddings": 4096}},
              quants=("q8_0", "mxfp4_moe"),
              reference_config={"rope_parameters": {
                  "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                  "beta_slow": 1.0, "truncate": True, "original_max_position_embeddings": 4096}},
              family="sliding-window"),
        # lfm2moe: one leading dense layer, then MoE on a full-attention layer and on a
        # short-convolution layer, so the model routes twice and both layer kinds stream. Tied
        # embeddings as in the real models: the converter has no name for an lm_head.
        _arch("lfm2moe", "lfm2_moe", 104, "LFM2-8B-A1B, LFM2-24B-A2B",
              config={"tie_word_embeddings": True, "num_hidden_layers": 3, "num_dense_layers": 1,
                      "layer_types": ["conv", "full_attention", "conv"], "conv_L_cache": 3,
                      "intermediate_size": 128, "moe_intermediate_size": 128, "num_experts": 32,
                      "num_experts_per_tok": 4},
              # transformers starts the routing bias at zero; a random one makes exp_probs_b count.
              random_init=("feed_forward.expert_bias",),
              family="short-conv"),
        # granitehybrid (Granite 4 "H"): an attention layer (no RoPE, as in the hybrid models),
        # then a Mamba2 layer, each with routed experts and a shared expert, and Granite's
        # residual/attention/logit multipliers at the real models' values. The embedding one is 4,
        # not the real 12: at 12 the random embeddings swamp what the layers add and the prefetch
        # guess is never wrong, so its gate could not see both paths. The converter finds
        # attention layers by the layer_types name "attention" the real config.json carries;
        # transformers writes "full_attention" and reads both.
        _arch("granitehybrid", "granitemoehybrid", 105, "Granite-4.0-H-Tiny, Granite-4.0-H-Small",
              config={"layer_types": ["full_attention", "linear_attention"], "intermediate_size": 128,
                      "shared_intermediate_size": 128, "num_local_experts": 32, "num_experts_per_tok": 4,
                      "mamba_n_heads": 8, "mamba_d_state": 16, "mamba_n_groups": 1, "mamba_d_conv": 4,
                      "mamba_expand": 2, "embedding_multiplier": 4.0, "residual_multiplier": 0.22,
                      "attention_multiplier": 0.0625, "logits_scaling": 4.0},
              saved_config={"layer_types": ["attention", "mamba"]},
              family="mamba2"),
        # qwen3next: one gated-DeltaNet layer, then one gated full-attention layer (the real model
        # repeats 3 + 1); a shared expert with a sigmoid gate beside the routed ones. The linear
        # attention keeps Qwen3-Next's ratio of 2 key heads to 4 value heads; llama.cpp needs key
        # and value head dims equal. transformers builds no multi-token-prediction block, which the
        # converter otherwise insists on finding: "--no-mtp".
        _arch("qwen3next", "qwen3_next", 121, "Qwen3-Next-80B-A3B",
              config={"intermediate_size": 128, "moe_intermediate_size": 128,
                      "shared_expert_intermediate_size": 128, "num_experts": 32,
                      "num_experts_per_tok": 4, "num_key_value_heads": 2, "head_dim": 16,
                      "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
                      "linear_value_head_dim": 16, "linear_num_key_heads": 2,
                      "linear_num_value_heads": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
                      "layer_types": ["linear_attention", "full_attention"]},
              converter_args=("--no-mtp",),
              family="deltanet"),
        # Mixtral: the converter writes it as general.architecture "llama" with experts, so the
        # recipe (and the registry) is keyed "llama"; a llama GGUF without experts is dense and is
        # refused as such. GQA 4:2 as Mixtral's 32:8; rope theta 1e6 as Mixtral's.
        _arch("llama", "mixtral", 122, "Mixtral-8x7B, Mixtral-8x22B",
              config={"intermediate_size": 128, "num_local_experts": 32, "num_experts_per_tok": 4,
                      "num_key_value_heads": 2,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
        # gemma4 (the 26B-A4B form): every layer runs a dense GELU MLP and 32 routed experts side by
        # side; the router reads its own scaled RMS norm (router.scale) and each expert's output has
        # a scale (per_expert_scale), both random here (transformers starts them at one). One
        # sliding-window layer (window 8, crossed by the parity prompt), then a full-attention one
        # whose keys double as values (attention_k_eq_v). The converter takes only a Llama-style
        # byte-fallback BPE with "<mask>" among its special tokens: SmolLM2's vocabulary in that
        # form, plus "<mask>" (vocab 49153). llama.cpp's CPU GELU goes through an fp16 table
        # (ggml_rounding.py); the reference does the same instead of the bound growing to ~5e-3.
        _arch("gemma4", "gemma4_text", 123, "Gemma-4-26B-A4B",
              config={"vocab_size": _VOCAB + 1, "tie_word_embeddings": True, "num_key_value_heads": 2,
                      "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1,
                      "attention_k_eq_v": True, "layer_types": ["sliding_attention", "full_attention"],
                      "sliding_window": 8, "enable_moe_block": True, "num_experts": 32,
                      "top_k_experts": 4, "moe_intermediate_size": 128, "intermediate_size": 128,
                      "hidden_size_per_layer_input": 0, "final_logit_softcapping": 30.0},
              special_tokens=("<mask>",), tokenizer="spm-bpe",
              random_init=("router.scale", "router.per_expert_scale"),
              reference_config={"hidden_activation": GELU_FP16},
              family="sliding-window"),
        # deepseek2 in its DeepSeek-V3 form (transformers' deepseek_v3; the converter writes both
        # V2 and V3 as deepseek2): MLA attention, one shared expert, a leading dense layer, and
        # sigmoid routing with a per-expert selection bias over group-limited top-k (8 groups of
        # 4, the best 2 kept). llama.cpp reads q_lora_rank unless the model has 26/27 layers
        # ("Lite"), so the tiny one has it. transformers' deepseek_v3 always routes by sigmoid,
        # but the converter writes the gating function only from config.json's scoring_func (as
        # the real V3 configs carry it; without it llama.cpp routes by softmax). transformers
        # starts the selection bias at zero: the recipe randomises it so exp_probs_b is compared.
        _arch("deepseek2", "deepseek_v3", 131, "DeepSeek-V3/R1, Kimi K2, Moonlight-16B-A3B, DeepSeek-V2(-Lite)",
              config={"num_hidden_layers": 3, "first_k_dense_replace": 1, "intermediate_size": 128,
                      "moe_intermediate_size": 128, "n_routed_experts": 32, "num_experts_per_tok": 4,
                      "n_shared_experts": 1, "n_group": 8, "topk_group": 2, "norm_topk_prob": True,
                      "routed_scaling_factor": 2.5, "q_lora_rank": 32, "kv_lora_rank": 32,
                      "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
                      "scoring_func": "sigmoid", "topk_method": "noaux_tc"},
              random_init=("e_score_correction_bias",),
              family="mla"),
        # glm4moe: a leading dense layer, one shared expert, sigmoid routing with a per-expert
        # selection bias (randomised, as above), attention with q/k/v biases and RoPE on half of
        # each head, and the NextN block (blk.3, experts included) the real GGUFs carry. The
        # converter names GLM's own special tokens as BOS/EOT/EOM.
        _arch("glm4moe", "glm4_moe", 132, "GLM-4.5-Air, GLM-4.5, GLM-4.6",
              config={"vocab_size": _VOCAB + 3, "num_hidden_layers": 3, "first_k_dense_replace": 1,
                      "intermediate_size": 128, "moe_intermediate_size": 128, "n_routed_experts": 32,
                      "num_experts_per_tok": 4, "n_shared_experts": 1, "num_key_value_heads": 2,
                      "attention_bias": True, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                          "partial_rotary_factor": 0.5}},
              random_init=("e_score_correction_bias",),
              special_tokens=("[gMASK]", "<|user|>", "<|observation|>"), mtp_layers=1),
        # dots1: DeepSeek-V3-style routing (sigmoid, randomised selection bias, normalised and
        # scaled weights) with two shared experts, a leading dense layer and q/k norms. As for
        # deepseek2, the converter takes the gating function from config.json's scoring_func.
        # llama.cpp's dots1 sizes K and V by n_head: n_head_kv must equal n_head (as in dots.llm1).
        _arch("dots1", "dots1", 133, "dots.llm1 (142B-A14B)",
              config={"num_hidden_layers": 3, "first_k_dense_replace": 1, "intermediate_size": 128,
                      "moe_intermediate_size": 128, "n_routed_experts": 32, "num_experts_per_tok": 4,
                      "n_shared_experts": 2, "norm_topk_prob": True,
                      "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
                      "layer_types": ["full_attention"] * 3},
              random_init=("e_score_correction_bias",)),
        # minimax-m2: sigmoid routing with a per-expert selection bias (randomised), no shared
        # expert, q/k norms over all heads, RoPE on half of each head. The converter reads the
        # rotary width from rotary_dim and the gating function from scoring_func (as the real
        # config.json carries them); transformers from partial_rotary_factor.
        _arch("minimax-m2", "minimax_m2", 134, "MiniMax-M2, MiniMax-M2.1",
              config={"intermediate_size": 128, "num_local_experts": 32, "num_experts_per_tok": 4,
                      "num_key_value_heads": 2, "head_dim": 16, "rotary_dim": 8,
                      "scoring_func": "sigmoid",
                      "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                          "partial_rotary_factor": 0.5}},
              random_init=("e_score_correction_bias",)),
        # llama4: four layers, experts on every second one (Maverick's interleave step 2; Scout's is
        # 1), so a dense SwiGLU layer comes before each MoE one; each MoE layer has a shared
        # expert beside one routed expert picked by its raw logit and weighted by its sigmoid,
        # applied to the expert's input. Layers 0-2 use RoPE with weightless q/k RMS norms (as
        # Scout; llama.cpp turns them off only for 128 experts) and chunked attention, layer 3
        # none (NoPE, full attention, temperature-tuned queries). llama.cpp fixes the chunk at
        # 8192 and the NoPE step at 4 whatever the config says, so the config keeps those values;
        # a short prompt stays in one chunk. head_dim must be given (its default is 128).
        _arch("llama4", "llama4_text", 135, "Llama-4-Scout-17B-16E, Llama-4-Maverick-17B-128E",
              config={"num_hidden_layers": 4, "interleave_moe_layer_step": 2, "intermediate_size": 128,
                      "intermediate_size_mlp": 128, "num_local_experts": 32, "num_experts_per_tok": 1,
                      "num_key_value_heads": 2, "head_dim": 16, "use_qk_norm": True,
                      "attention_chunk_size": 8192, "no_rope_layer_interval": 4,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
              family="chunked"),
        # qwen3vlmoe: the language model of Qwen3-VL-30B-A3B, built as the whole vision-language
        # model (transformers has no causal-LM class for it) with a one-block vision tower the
        # converter leaves out of the text GGUF. Qwen3-MoE layers (q/k norms, softmax top-k) with
        # interleaved M-RoPE (sections 4+2+2 of the 8 rotary pairs, as the real 24+20+20 of 64):
        # on text every section sees the same position, so it is plain RoPE on both sides. The
        # vision tower's one deepstack index makes llama.cpp carry a second embedding slice, zero
        # for text tokens, that it adds after layer 0 (deepstack_out-0), as the real files do.
        # Qwen-VL's vision tokens are special tokens after SmolLM2's vocabulary (49152 on), the
        # config's ids pointing at them: mtmd then spells <|vision_start|> as one token, as
        # transformers does, and the image parity test (tests/archs) compares the two sides.
        _arch("qwen3vlmoe", "qwen3_vl_moe", 136, "Qwen3-VL-30B-A3B, Qwen3-VL-235B-A22B (language model)",
              special_tokens=QWEN_VL_TOKENS,
              config={"vocab_size": _VOCAB + len(QWEN_VL_TOKENS), "intermediate_size": 128, "moe_intermediate_size": 128, "num_experts": 32,
                      "num_experts_per_tok": 4, "num_key_value_heads": 2, "head_dim": 16,
                      "decoder_sparse_step": 1, "mlp_only_layers": [],
                      "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                          "mrope_section": [4, 2, 2], "mrope_interleaved": True}},
              outer_config={"tie_word_embeddings": False,
                            **{f"{t}_token_id": _VOCAB + i for i, t in enumerate(("vision_start", "vision_end",
                                                                                  "image", "video"))},
                            "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64,
                                              "num_heads": 2, "out_hidden_size": 64,
                                              "deepstack_visual_indexes": [0],
                                              "num_position_embeddings": 64}},
              auto_class="AutoModelForImageTextToText",
              # its projector (write_hf_mmproj): Qwen-VL's processor with the tiny vision tower's
              # patches (16 px, 2x2 merged), images of 8 to 1024 tokens, pixels mapped to [-1, 1]
              preprocessor={"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16,
                            "merge_size": 2, "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5],
                            "image_std": [0.5, 0.5, 0.5],
                            "size": {"shortest_edge": 8 * 32 * 32, "longest_edge": 1024 * 32 * 32}},
              # The real checkpoints hold the packed experts as [n_expert, n_embd, 2*n_ff] and
              # [n_expert, n_ff, n_embd], the converter's layout; transformers 5 writes its own.
              checkpoint_transpose=("mlp.experts.gate_up_proj", "mlp.experts.down_proj")),
        # ernie4_5-moe (ERNIE-4.5-21B-A3B's form): a leading dense layer, then MoE layers with a
        # shared expert, softmax routing whose pick adds a per-expert selection bias
        # (moe_statics.e_score_correction_bias, randomised: transformers starts it at zero), q/k
        # without norms. The converter sizes the shared expert as intermediate_size //
        # num_key_value_heads (true of the real configs: 12288 // 4 = 2 x 1536), so the dense FFN
        # is 2 x 128 wide here. It reads only a SentencePiece model: tokenizer "spm", SmolLM2's
        # vocabulary as one, plus the byte pieces it lacks (hf_tokenizer.SPM_BYTE_PIECES).
        _arch("ernie4_5-moe", "ernie4_5_moe", 137, "ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B",
              config={"vocab_size": _VOCAB + SPM_BYTE_PIECES, "tie_word_embeddings": True,
                      "num_hidden_layers": 3, "num_key_value_heads": 2, "intermediate_size": 256,
                      "moe_intermediate_size": 128, "moe_num_experts": 32, "moe_k": 4,
                      "moe_num_shared_experts": 1, "moe_layer_start_index": 1, "moe_layer_end_index": 2,
                      "moe_layer_interval": 1},
              # A selection bias of std 0.1 would swamp probabilities near 1/32 (every token would
              # pick the same few experts, which fit the eviction gate's cache); 0.01 moves the pick
              # without deciding it.
              random_init=("e_score_correction_bias",), random_init_std=0.01, tokenizer="spm"),
        # hunyuan-moe (Hunyuan-A13B's form): every layer runs a shared MLP beside its routed
        # experts (softmax top-k, weights renormalised), q/k RMS norms after RoPE, GQA. The
        # converter reads per-layer lists (moe_topk, moe_intermediate_size, num_shared_expert) as
        # the real config.json carries them, and takes the vocabulary only as tiktoken-style
        # mergeable_ranks from the folder's own tokenizer class: tokenizer "ranks". Plain RoPE: the
        # real config's dynamic-alpha RoPE is asserted by the converter to be exactly the real
        # model's (head dim 128), and is only a different base.
        _arch("hunyuan-moe", "hunyuan_v1_moe", 138, "Hunyuan-A13B",
              config={"num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
                      "num_experts": 32, "moe_topk": [4, 4], "moe_intermediate_size": [128, 128],
                      "num_shared_expert": [1, 1], "use_qk_norm": True, "use_cla": False},
              tokenizer="ranks"),
        # granitemoe (Granite 3.x MoE, no Mamba layers, no shared expert): attention layers with
        # softmax-routed experts and Granite's residual/attention/logit multipliers at the real
        # models' values but the embedding one, 1 instead of the real 12: the random embeddings
        # swamp what the layers add otherwise, and with no Mamba layer between, even granitehybrid's
        # 4 left the prefetch guess right every time (its gate needs both paths to run).
        _arch("granitemoe", "granitemoe", 139, "granite-3.1-1b-a400m, granite-3.1-3b-a800m",
              config={"num_key_value_heads": 2, "intermediate_size": 128, "num_local_experts": 32,
                      "num_experts_per_tok": 4, "embedding_multiplier": 1.0, "residual_multiplier": 0.22,
                      "attention_multiplier": 0.0625, "logits_scaling": 4.0}),
        # mistral4 (Mistral-Small-4): DeepSeek-V2's layer as llama.cpp builds it (deepseek2's graph:
        # MLA with q_lora_rank, a shared expert, softmax routing over group-limited top-k, here 4
        # groups of 8 with the best 2 kept) with experts stored packed. The pinned converter takes it
        # only as the vision-language wrapper the real checkpoint ships as
        # ("Mistral3ForConditionalGeneration", choosing its Mistral-4 text model by model_type), so
        # the recipe builds that whole model, its text model a Mistral-4 one, with a one-layer vision
        # tower the converter leaves out of the text GGUF.
        _arch("mistral4", "mistral3", 149, "Mistral-Small-4-119B",
              config={"model_type": "mistral4", "intermediate_size": 128, "moe_intermediate_size": 128, "n_routed_experts": 32,
                      "num_experts_per_tok": 4, "n_shared_experts": 1, "n_group": 4, "topk_group": 2,
                      "norm_topk_prob": True, "routed_scaling_factor": 1.0, "q_lora_rank": 32,
                      "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16,
                      "v_head_dim": 16, "num_key_value_heads": 4, "first_k_dense_replace": 0},
              outer_config={"tie_word_embeddings": False,
                            "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                              "num_attention_heads": 2, "image_size": 64, "patch_size": 16}},
              auto_class="AutoModelForImageTextToText", family="mla"),
        # nemotron_h_moe (Nemotron 3 Nano's form): a Mamba2 layer, a MoE layer, an attention layer
        # (no RoPE), a MoE layer, as the real "MEMEM*E..." pattern; each block is one of the
        # three, so it routes twice. Experts have no gate (up, ReLU^2, down) and a shared expert
        # beside them; sigmoid routing with a per-expert selection bias (randomised: transformers
        # starts it at zero), weights normalised and scaled by 2.5, one expert group, as Nano.
        # Experts of 192: with no gate projection, the Q8_0 experts at 128 (1.1 MB) nearly fit the
        # eviction gate's 1 MiB cache, and the tokens it runs touched fewer than all of them.
        _arch("nemotron_h_moe", "nemotron_h", 180, "NVIDIA-Nemotron-3-Nano-30B-A3B",
              config={"layers_block_type": ["linear_attention", "moe", "full_attention", "moe"],
                      "num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 16,
                      "intermediate_size": 128, "moe_intermediate_size": 192,
                      "moe_shared_expert_intermediate_size": 128, "n_routed_experts": 32,
                      "num_experts_per_tok": 4, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
                      "routed_scaling_factor": 2.5, "mamba_num_heads": 8, "mamba_head_dim": 16,
                      "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4},
              random_init=("e_score_correction_bias",),
              family="mamba2"),
        # jamba (Jamba-v0.1's layout at a quarter of the length): Mamba1 layers with an attention
        # layer (no RoPE) at index 2 of 4, and experts on every second layer from 1 (the real
        # period 2, offset 1), so the MoE layers follow a Mamba and an attention layer and the
        # dense SwiGLU layers between them load whole. llama.cpp accepts only mamba_expand 2.
        # Softmax top-k routing, the weights left unnormalised. The converter reads a
        # SentencePiece model when the folder has one, as the real ones do: tokenizer "spm".
        _arch("jamba", "jamba", 181, "Jamba-v0.1, AI21-Jamba-Mini-1.5/1.6/1.7, AI21-Jamba-Large-1.5",
              config={"vocab_size": _VOCAB + SPM_BYTE_PIECES, "num_hidden_layers": 4,
                      "num_key_value_heads": 2, "intermediate_size": 128, "num_experts": 32,
                      "num_experts_per_tok": 4, "expert_layer_period": 2, "expert_layer_offset": 1,
                      "attn_layer_period": 4, "attn_layer_offset": 2, "mamba_d_state": 16,
                      "mamba_d_conv": 4, "mamba_expand": 2},
              tokenizer="spm", family="mamba"),
        # bailingmoe3 (Ling 3.0; transformers' bailing_hybrid): two Kimi-delta-attention (KDA)
        # layers, then a gated MLA layer (layer_group_size 3: the last of each group is MLA, as
        # Ling 3.0's 5 + 1), the first layer dense, then routed experts with a shared expert and
        # DeepSeek-V3-style routing: sigmoid, a per-expert selection bias (randomised), 8 groups
        # of 4 experts of which the best 2 are kept, weights normalised and scaled by 2.5. No
        # q_lora_rank (the loader takes it as optional). transformers builds no
        # multi-token-prediction layer: num_mtp_layers 0. The converter reads keys transformers' config renames on load
        # (norm_topk_prob, n_group) or does not have (no_kda_lora, head-wise attention gates,
        # score_function), and the class name BailingMoeV3ForCausalLM: so the saved config.json
        # carries them, under a model_type transformers does not know ("bailing_moe_v3"), which
        # makes the converter read config.json as written instead of through AutoConfig.
        _arch("bailingmoe3", "bailing_hybrid", 182, "Ling-3.0-tiny, Ling-3.0-flash",
              config={"num_hidden_layers": 3, "layer_group_size": 3, "first_k_dense_replace": 1,
                      "num_key_value_heads": 4, "head_dim": 16, "intermediate_size": 128,
                      "moe_intermediate_size": 128, "moe_shared_expert_intermediate_size": 128,
                      "num_local_experts": 32, "num_experts_per_tok": 4, "n_shared_experts": 1,
                      "n_group": 8, "topk_group": 2, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                      "kv_lora_rank": 32, "q_lora_rank": None, "qk_rope_head_dim": 16,
                      "qk_nope_head_dim": 16, "v_head_dim": 16, "short_conv_kernel_size": 4,
                      "max_position_embeddings": 4096, "rope_theta": 6000000.0, "num_mtp_layers": 0},
              saved_config={"architectures": ["BailingMoeV3ForCausalLM"], "no_kda_lora": True,
                            "gated_attention_proj_granularity_type": "head_wise",
                            "score_function": "sigmoid", "norm_topk_prob": True, "n_group": 8,
                            "model_type": "bailing_moe_v3"},
              random_init=("e_score_correction_bias",),
              family="kda"),
        # kimi-linear (Kimi-Linear-48B-A3B): a Kimi-delta-attention layer (gated DeltaNet with a
        # per-channel decay, short convolutions on q/k/v), then an MLA layer without RoPE and
        # without q compression (the real model repeats 3 + 1), each with DeepSeek-V3-style
        # routing: sigmoid scores plus a per-expert selection bias (randomised), weights
        # renormalised and scaled, one shared expert. No leading dense layer (the real model has
        # one): transformers saves every layer's MLP under the MoE's checkpoint prefix
        # block_sparse_moe, where the converter finds no name for a dense one. llama.cpp runs
        # KDA and MLA with n_head heads both: linear_num_heads = num_attention_heads; its MLA
        # converter splits kv_b by num_key_value_heads, which must also be n_head. The converter
        # reads the layer kinds and KDA sizes only from linear_attn_config (1-based layer
        # numbers, as the real config.json carries it; transformers reads it too), and the gating function from
        # moe_router_activation_func (likewise; without it the loader refuses the file).
        # rms_norm_eps 1e-6: llama.cpp's KDA l2-normalises q and k with the model's RMS eps where
        # transformers fixes 1e-6 (at 1e-5 parity is 1.5e-3, the difference all from there).
        _arch("kimi-linear", "kimi_linear", 150, "Kimi-Linear-48B-A3B",
              config={"layer_types": ["linear_attention", "full_attention"], "first_k_dense_replace": 0,
                      "intermediate_size": 128, "moe_intermediate_size": 128, "num_local_experts": 32,
                      "num_experts_per_tok": 4, "num_shared_experts": 1, "routed_scaling_factor": 2.446,
                      "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
                      "rms_norm_eps": 1e-6,
                      "linear_attn_config": {"full_attn_layers": [2], "kda_layers": [1], "head_dim": 16,
                                             "num_heads": 4, "short_conv_kernel_size": 4}},
              saved_config={"moe_router_activation_func": "sigmoid"},
              random_init=("e_score_correction_bias",),
              family="kda"),
        # minimax-m3: the language model of MiniMax-M3, built as the whole vision-language model
        # (MiniMaxM3SparseForConditionalGeneration: the class name the converter registers for the
        # text GGUF; transformers' text-only class has another) with a one-block vision tower the
        # converter leaves out. A leading dense layer with full attention, then two MoE layers with
        # MiniMax sparse attention (an indexer picks key blocks; llama.cpp runs it only with flash
        # attention, dense otherwise). Blocks of 4, 8 picked: the 21-token parity prompt sees every
        # block (dense either way), longer gate prompts are block-sparse. Sigmoid routing with a
        # selection bias (randomised), swigluoai experts, a shared expert, Gemma-style norms (the
        # converter adds the 1). The converter writes the dense FFN width from intermediate_size,
        # so dense_intermediate_size equals it. One KV head and one indexer head (llama.cpp needs
        # them equal; real: 4 and 4): with two, the indexer's per-head q norm in a narrow prefill
        # tail is wide enough for the offload rule, and its weightless score matmul follows it onto
        # the device, which G18g's narrow-tail check counts. The converter reads the shared-expert
        # count, the gating function and the dense/sparse layer lists only as the real config.json
        # spells them (n_shared_experts, scoring_func, moe_layer_freq, sparse_attention_config;
        # transformers writes none of them), and the rotary width from rotary_dim; it reads the
        # top level and text_config as one, so saved_config's top-level keys reach it.
        _arch("minimax-m3", "minimax_m3_vl", 151, "MiniMax-M3 (language model)",
              config={"num_hidden_layers": 3, "num_key_value_heads": 1, "head_dim": 16, "rotary_dim": 8,
                      "intermediate_size": 128, "dense_intermediate_size": 128,
                      "shared_intermediate_size": 128, "num_local_experts": 32, "num_experts_per_tok": 4,
                      "routed_scaling_factor": 2.0, "mlp_layer_types": ["dense", "sparse", "sparse"],
                      "layer_types": ["full_attention", "minimax_m3_sparse", "minimax_m3_sparse"],
                      "index_n_heads": 1, "index_head_dim": 16, "index_block_size": 4,
                      "index_topk_blocks": 8, "index_local_blocks": 1,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                          "partial_rotary_factor": 0.5}},
              outer_config={"tie_word_embeddings": False, "projector_hidden_size": 64,
                            "vision_config": {"hidden_size": 32, "intermediate_size": 64,
                                              "num_hidden_layers": 1, "num_attention_heads": 2,
                                              "image_size": 56}},
              auto_class="AutoModelForImageTextToText",
              saved_config={"n_shared_experts": 1, "scoring_func": "sigmoid", "moe_layer_freq": [0, 1, 1],
                            "sparse_attention_config": {"sparse_num_index_heads": 1, "sparse_index_dim": 16,
                                                        "sparse_topk_blocks": 8, "sparse_block_size": 4,
                                                        "sparse_local_block": 1,
                                                        "sparse_attention_freq": [0, 1, 1]}},
              random_init=("e_score_correction_bias",),
              family="msa"),
        # glm5-next (GLM-5.3-Flash): four mHC residual streams (hc_mult must be 4) mixed by learned
        # pre/post/Sinkhorn weights around every attention and FFN block; KDA (Kimi delta attention)
        # layers beside NoPE MLA layers whose DSA indexer scores pools of index_kpool tokens and keeps
        # the best index_topk / index_kpool of them plus the unfinished tail. A leading dense layer,
        # then DeepSeek-V3 routing (sigmoid, randomised selection bias, normalised and scaled weights)
        # with one shared expert. Layers: KDA (dense), KDA, MLA with its own indexer, MLA sharing that
        # selection, so both layer kinds and both indexer modes route; transformers' shared indexer
        # must directly follow a full one (a KDA layer between drops the selection), as it does here.
        # The indexer keeps its top index_topk tokens (whole pools of 4, plus the unfinished tail);
        # 1024 is more than any context the suite opens (512 at most), so every past token is
        # attended, in llama.cpp (which still runs the indexer and masks by its pick) as in
        # transformers. At 32, parity held and G1-G4 passed, but llama.cpp's pick for decisions
        # prefilled side by side on forked streams did not equal one by one (G19, resident too).
        # Built as the whole vision-language model (transformers has no causal-LM
        # class for it) with a one-block vision tower the converter leaves out; the text config's
        # default pad id (154820) is outside the tiny vocabulary, so it has none. The converter reads
        # the real config.json's spellings: first_k_dense_replace, mla_use_nope and the
        # linear_attn_config dict (transformers reads mlp_layer_types and linear_*). The mHC mixing
        # biases and the indexer's pool gate/position weights start at constants in transformers and
        # are randomised here. No NextN block: llama.cpp's NextN layer has no mHC weights, which
        # transformers' ordinary trailing layer would carry.
        _arch("glm5-next", "glm5_next", 160, "GLM-5.3-Flash",
              config={"vocab_size": _VOCAB + 3, "pad_token_id": None, "num_hidden_layers": 4,
                      "layer_types": ["linear_attention", "linear_attention", "indexed_attention",
                                      "indexed_attention"],
                      "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
                      "indexer_types": ["full", "full", "full", "shared"],
                      "intermediate_size": 128, "moe_intermediate_size": 128, "n_routed_experts": 32,
                      "num_experts_per_tok": 4, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
                      "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                      "q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 0,
                      "qk_nope_head_dim": 16, "v_head_dim": 16,
                      "index_n_heads": 2, "index_head_dim": 16, "index_topk": 1024, "index_kpool": 4,
                      "linear_head_dim": 16, "linear_num_heads": 4, "linear_conv_kernel_dim": 4,
                      "linear_lower_bound": -5.0, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6},
              outer_config={"tie_word_embeddings": False,
                            "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64,
                                              "num_heads": 2, "out_hidden_size": 64,
                                              "projection_intermediate_size": 64}},
              auto_class="AutoModelForImageTextToText",
              saved_config={"first_k_dense_replace": 1, "mla_use_nope": True,
                            "linear_attn_config": {"num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4,
                                                   "gate_lower_bound": -5.0}},
              random_init=("e_score_correction_bias", "attn_hc.base", "ffn_hc.base",
                           "index_kpool_compress_ape", "index_kpool_compress_gate"),
              special_tokens=("[gMASK]", "<|user|>", "<|observation|>"),
              family="kda-dsa"),
        # glm-dsa (GLM-5.x): MLA (q_lora_rank, RoPE on 16 of each head's 32 query/key dims) whose DSA
        # lightning indexer picks the top index_topk past tokens each query attends; a "shared"
        # layer reuses the previous full layer's pick (as GLM-5.2's indexer_types, which the
        # converter writes and llama.cpp reads). A leading dense layer, then sigmoid routing with a
        # randomised selection bias and one shared expert, and the NextN block (blk.3) the real GGUFs
        # carry. Indexer top-k 32: the parity prompt (21 tokens) is shorter, so every past token is
        # attended on both sides; the gates' longer prompts run llama.cpp's sparse selection (the
        # indexer's top-k becomes the attention mask), streamed and resident alike. llama.cpp rotates
        # the indexer's q and k by a Hadamard matrix of at least 64 (the KV cache's k rotation), so
        # the indexer head is 64 wide. The NextN block is built as a trailing layer (hf_mtp.py), so
        # the config lists 4 indexer types; the saved config.json lists the 3 of the trunk, the length
        # llama.cpp and transformers require (layer_types and mlp_layer_types likewise).
        _arch("glm-dsa", "glm_moe_dsa", 161, "GLM-5, GLM-5.1, GLM-5.2",
              config={"vocab_size": _VOCAB + 3, "num_hidden_layers": 3, "first_k_dense_replace": 1,
                      "indexer_types": ["full", "full", "shared", "full"],
                      "intermediate_size": 128, "moe_intermediate_size": 128, "n_routed_experts": 32,
                      "num_experts_per_tok": 4, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
                      "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                      "q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 16,
                      "qk_nope_head_dim": 16, "v_head_dim": 16,
                      "index_n_heads": 2, "index_head_dim": 64, "index_topk": 32},
              saved_config={"indexer_types": ["full", "full", "shared"],
                            "layer_types": ["indexed_attention"] * 3,
                            "mlp_layer_types": ["dense", "sparse", "sparse"]},
              random_init=("e_score_correction_bias",),
              special_tokens=("[gMASK]", "<|user|>", "<|observation|>"), mtp_layers=1,
              family="dsa"),
        # exaone-moe (K-EXAONE): a leading dense layer, then MoE layers with one shared expert and
        # sigmoid routing with a per-expert selection bias (randomised: transformers starts it at
        # zero), weights renormalised and scaled; q/k RMS norms. Sliding-window layers use RoPE,
        # the full-attention layer none (NoPE), as the real 3 sliding + 1 global pattern: here two
        # sliding layers (window 8, crossed by the parity prompt) and a global one, by an explicit
        # layer_types (the default pattern of 4 would make all three sliding). The loader requires
        # the gating function, which the converter writes only from config.json's scoring_func.
        # One expert group (as the real model). No NextN block: K-EXAONE's is a dense layer the
        # loader skips (the trunk never computes it), with no experts to stream.
        _arch("exaone-moe", "exaone_moe", 190, "K-EXAONE-236B-A23B",
              config={"num_hidden_layers": 3, "first_k_dense_replace": 1, "num_key_value_heads": 2,
                      "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 128,
                      "num_experts": 32, "num_experts_per_tok": 4, "num_shared_experts": 1,
                      "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1,
                      "topk_group": 1, "scoring_func": "sigmoid", "sliding_window": 8,
                      "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
              random_init=("e_score_correction_bias",),
              family="sliding-window"),
        # afmoe (Arcee Trinity): a leading dense layer, then MoE layers with a shared expert and
        # sigmoid routing with a per-expert selection bias, weights renormalised and scaled.
        # transformers starts both the router (router.gate) and the bias (expert_bias) at zero, so
        # every token would pick the same experts: both are randomised. Attention is gated, with
        # q/k norms, and RMS norms after attention and after the FFN as well as before. llama.cpp
        # fixes the sliding-window pattern at 3 sliding + 1 full and makes every 4th layer NoPE,
        # whatever the config says (the converter writes no pattern): so four layers, the global
        # one last, with global_attn_every_n_layers at 4, and a window of 8 the parity prompt
        # crosses. llama.cpp always scales the embeddings by sqrt(n_embd): mup_enabled, as the
        # real configs have it.
        # The converter writes the weight renormalisation only from config.json's route_norm (the
        # real configs carry it; transformers always renormalises); head_dim must be given (its
        # default is 128 whatever the width).
        _arch("afmoe", "afmoe", 191, "Trinity-Nano-6B, Trinity-Mini-26B, Trinity-Large",
              config={"num_hidden_layers": 4, "num_dense_layers": 1, "num_key_value_heads": 2,
                      "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 128,
                      "num_experts": 32, "num_experts_per_tok": 4, "num_shared_experts": 1,
                      "route_norm": True, "route_scale": 2.826, "global_attn_every_n_layers": 4,
                      "sliding_window": 8, "mup_enabled": True},
              random_init=("router.gate.weight", "expert_bias"),
              family="sliding-window"),
        # cohere2moe: Cohere's parallel block (attention and FFN both read the layer's one input
        # norm, and both outputs join the residual), a leading dense layer (full attention, with
        # RoPE as llama.cpp forces on the dense prefix), then a sliding-window MoE layer (RoPE,
        # window 8, crossed by the parity prompt) and a full-attention NoPE one
        # (sliding_window_pattern 2 after the prefix). Each MoE layer picks the top k of the raw
        # router logits, weighs them by their sigmoid renormalised (expert_selection_fn "sigmoid",
        # llama.cpp's default for the arch) and averages its experts with one shared expert. The
        # input norm is an RMS norm (rms_norm_eps given; without it both run a bias-free LayerNorm).
        # The converter reads the expert width from intermediate_size and the dense prefix's from
        # prefix_dense_intermediate_size, which must be given (transformers saves its null, which
        # the converter takes for the key and writes no FFN width), and finds the dense prefix in
        # mlp_layer_types, which transformers writes from the first_k_dense_replace it is built
        # with. Tied embeddings as Cohere's; the logit scale is 0.5, not the real 0.0625: at that
        # the tiny model's logits spread by 0.4 in all, the next-token distribution is flat, and
        # the parity check would see differences 16 times smaller than they are.
        _arch("cohere2moe", "cohere2_moe", 192, "Cohere2 MoE (North-Mini-Code-1.0)",
              config={"num_hidden_layers": 3, "first_k_dense_replace": 1, "num_key_value_heads": 2,
                      "head_dim": 16, "intermediate_size": 128, "prefix_dense_intermediate_size": 256,
                      "num_experts": 32, "num_experts_per_tok": 4, "num_shared_experts": 1,
                      "expert_selection_fn": "sigmoid", "norm_topk_prob": True,
                      "rms_norm_eps": 1e-5, "sliding_window": 8, "sliding_window_pattern": 2,
                      "tie_word_embeddings": True, "logit_scale": 0.5},
              family="sliding-window"),
        # dbrx: bias-free LayerNorms, fused QKV clamped to +-clip_qkv, softmax routing whose top-k
        # weights are renormalised (moe_normalize_expert_weights 1, an L1 norm: llama.cpp always
        # renormalises), every layer MoE. Its config nests attention and FFN settings
        # (attn_config, ffn_config) as the real config.json does. Both the converter and
        # transformers' attention read rope_theta from attn_config (the real models': 5e5), beside
        # rope_parameters, which transformers' rotary embedding reads. The width is also given as
        # d_model: transformers copies d_model into ffn_config (which sizes the experts and the
        # router) before hidden_size, its alias, is applied. The clamp is 1, not the real 8, so
        # that it bites on the tiny model's QKV (std ~0.8: a fifth of the values) and is compared.
        _arch("dbrx", "dbrx", 193, "DBRX-Base, DBRX-Instruct (132B)",
              config={"d_model": 64,
                      "attn_config": {"clip_qkv": 1.0, "kv_n_heads": 2, "rope_theta": 500000.0},
                      "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 32, "moe_top_k": 4,
                                     "moe_normalize_expert_weights": 1.0},
                      "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}),
        # deepseek4 (DeepSeek-V4-Flash's form): hyper-connections (4 residual streams: llama.cpp
        # asserts hc_mult 4), MQA attention with a q LoRA and grouped output LoRA (2 groups of 16),
        # attention sinks, and one layer of each attention kind: sliding window (8, crossed by the
        # parity prompt), CSA (ratio 4, with the lightning indexer keeping the best 2 compressed
        # entries) and HCA (ratio 128). llama.cpp needs a CSA layer (without one its indexer cache
        # has no head size and divides by zero) and an indexer head of at least 64 (its Hadamard
        # rotation of the indexer keys is 64 wide at least). Layer 0 routes by hash (tid2eid, filled
        # by hf_deepseek4.prepare_model), the others by sqrt-softplus top-k with a selection bias;
        # one shared expert. The converter reads only DeepSeek's own layout with MXFP4 experts:
        # checkpoint "deepseek4" writes it (hf_deepseek4.py), the experts on the MXFP4 grid so both
        # sides hold the same values. So every file's experts are MXFP4 (the "q8_0" one is llama.cpp's
        # quantizer's, from them), and llama.cpp's CPU MXFP4 matmul rounds the experts' inputs to
        # Q8_0, which flips routing and indexer picks (2e-2 to 0.9 off transformers; with the same
        # experts rewritten as F32, 9e-6): the reference rounds them the same (EXPERTS_Q8_0).
        # transformers starts the sinks, hyper-connection biases, compressor position biases and
        # selection bias at zero: randomised so that each is compared.
        _arch("deepseek4", "deepseek_v4", 140, "DeepSeek-V4-Flash",
              config={"num_hidden_layers": 3, "num_key_value_heads": 1, "head_dim": 32,
                      "partial_rotary_factor": 0.5, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16,
                      "index_n_heads": 2, "index_head_dim": 64, "index_topk": 2, "sliding_window": 8,
                      "moe_intermediate_size": 128, "n_routed_experts": 32, "num_experts_per_tok": 4,
                      "n_shared_experts": 1, "hc_mult": 4, "num_nextn_predict_layers": 0,
                      "layer_types": ["sliding_attention", "compressed_sparse_attention",
                                      "heavily_compressed_attention"],
                      "mlp_layer_types": ["hash_moe", "moe", "moe"]},
              random_init=("self_attn.sinks", "attn_hc.base", "ffn_hc.base", "hc_head.hc_base",
                           "position_bias", "e_score_correction_bias"),
              reference_config={"_experts_implementation": EXPERTS_Q8_0},
              quants=("q8_0", "mxfp4_moe"), checkpoint="deepseek4", family="csa"),
        # mellum (JetBrains Mellum2): every layer is MoE (llama.cpp's mellum builds no dense FFN, so
        # mlp_layer_types is all "sparse"), softmax top-k with the weights renormalised, q/k RMS
        # norms, one sliding-window layer (window 8, crossed by the parity prompt) before a
        # full-attention one, as the real 3:1 pattern; head_dim must be given (its default is 128).
        # One RoPE base for both layer kinds: llama.cpp's mellum graph rotates its sliding layers
        # with the model's base, where transformers' default config gives them a base of their own.
        _arch("mellum", "mellum", 148, "Mellum2-12B-A2.5B",
              config={"intermediate_size": 128, "moe_intermediate_size": 128, "num_experts": 32,
                      "num_experts_per_tok": 4, "num_key_value_heads": 2, "head_dim": 16,
                      "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
                      "mlp_layer_types": ["sparse", "sparse"],
                      "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}}},
              family="sliding-window"),
        # hy_v3 (Tencent Hy3): a leading dense layer (transformers' default mlp_layer_types), then
        # MoE layers with one ungated shared expert beside the routed ones; sigmoid routing whose
        # pick adds a per-expert selection bias (e_score_correction_bias, randomised: transformers
        # starts it at zero), weights renormalised and scaled by router_scaling_factor; q/k RMS norms
        # before RoPE, GQA.
        _arch("hy_v3", "hy_v3", 250, "Hy3 (Hy3-preview)",
              config={"num_hidden_layers": 3, "num_key_value_heads": 2, "head_dim": 16,
                      "intermediate_size": 128, "moe_intermediate_size": 128, "num_experts": 32,
                      "num_experts_per_tok": 4, "num_shared_experts": 1, "router_scaling_factor": 2.826},
              random_init=("e_score_correction_bias",)),
        # hy_v4 (Tencent Hy4): DeepSeek-V3-style MLA (q/kv LoRA ranks 32) with a sigmoid gate on the
        # attention output and a learned sink per head, DeepSeek sparse attention (an indexer on
        # layers 0 and 1, layer 2 reusing layer 1's pick: transformers' default indexer_types),
        # hyper-connections (4 residual streams, as the real model), a leading dense layer, then
        # sigmoid-routed experts with a selection bias beside a shared expert. index_topk 8: the
        # parity prompt's later queries each see only 8 of the keys (on both sides the output moves
        # by ~3 from the 9th token on if all are seen). 16 indexer heads, as the real model: a key
        # scores sum_h w_h * relu(q_h . k), exactly 0 when every head's dot product is negative,
        # and with 2 heads such ties at the 8th place made the two sides keep different keys.
        # qk_rope_head_dim 2: llama.cpp
        # rotates consecutive pairs (LLAMA_ROPE_TYPE_NORM for hy_v4, its converter permutes no
        # rows) where transformers' hy_v4 rotates the two halves of the rotary slice; with one
        # pair the two are the same rotation. Randomised: the selection bias and the sinks
        # (transformers starts both at zero).
        _arch("hy_v4", "hy_v4", 251, "Hy4 (Hy4-preview)",
              config={"num_hidden_layers": 3, "intermediate_size": 128, "moe_intermediate_size": 128,
                      "n_routed_experts": 32, "num_experts_per_tok": 4, "n_shared_experts": 1,
                      "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
                      "qk_rope_head_dim": 2, "v_head_dim": 16, "index_n_heads": 16,
                      "index_head_dim": 16, "index_topk": 8, "hc_mult": 4},
              random_init=("e_score_correction_bias", "self_attn.sinks"),
              # transformers 5 saves the hyper-connection tensors and the dense/shared MLPs' gate
              # under names its loader reads back but the real checkpoints (and so the converter's
              # tensor map) spell otherwise: hc_pre after the layer's hc_*_layer, no hc_pre above
              # the head, and gate_proj, which only the attention's gate calls linear_gate.
              checkpoint_rename=((r"\.hc_pre\.(hc_attn_layer|hc_mlp_layer)\.", r".\1.hc_pre."),
                                 (r"^model\.hc_pre\.hc_head\.", "model.hc_head."),
                                 (r"\.mlp\.(shared_experts\.)?linear_gate\.", r".mlp.\1gate_proj.")),
              family="dsa"),
        # laguna (poolside Laguna-XS.2's form): a full-attention layer, then two sliding-window ones
        # (llama.cpp fixes XS.2's period of 4, full first, whatever the config says; window 8,
        # crossed by the parity prompt), with more query heads on the sliding layers (8 against 4,
        # as XS.2's 64 against 48), q/k RMS norms and a softplus gate per head on the attention
        # output. RoPE per layer kind: YaRN (factor 4) over half of each head on full layers, plain
        # RoPE over all of it on sliding ones. A leading dense layer, then sigmoid-routed experts
        # with a selection bias (randomised: transformers starts it at zero), renormalised and
        # scaled, beside a shared expert.
        _arch("laguna", "laguna", 252, "Laguna-XS.2, Laguna-S.2, Laguna-M.1",
              config={"num_hidden_layers": 3, "num_key_value_heads": 2, "head_dim": 16,
                      "num_attention_heads_per_layer": [4, 8, 8],
                      "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
                      "sliding_window": 8, "gating": True, "intermediate_size": 128,
                      "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128,
                      "num_experts": 32, "num_experts_per_tok": 4, "moe_routed_scaling_factor": 2.5,
                      "rope_parameters": {
                          "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0,
                                             "partial_rotary_factor": 0.5, "factor": 4.0,
                                             "original_max_position_embeddings": 1024,
                                             "beta_fast": 32.0, "beta_slow": 1.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                "partial_rotary_factor": 1.0}}},
              random_init=("e_score_correction_bias",),
              family="sliding-window"),
        # granite_swa in its MoE form (transformers' granitemoe_swa, written as GraniteMoeSWA): a
        # full-attention layer, then a sliding-window one (window 8, crossed by the parity prompt),
        # both with a learned sink per head (randomised: transformers starts the sinks at zero),
        # softmax-routed experts with gate and up fused, a shared expert beside them, and
        # Granite's multipliers at granitemoe's values (embedding 1, for the same reason). RoPE on
        # every layer, one base: llama.cpp has one base for all layers, and reads NoPE layers
        # from no_rope_layers, a key transformers does not have (it reads layer_rope_theta).
        _arch("granite_swa", "granitemoe_swa", 254,
              "GraniteMoeSWA checkpoints (Granite with sliding-window attention and experts)",
              config={"num_key_value_heads": 2, "intermediate_size": 128, "shared_intermediate_size": 128,
                      "num_local_experts": 32, "num_experts_per_tok": 4,
                      "layer_types": ["full_attention", "sliding_attention"], "sliding_window": 8,
                      "embedding_multiplier": 1.0, "residual_multiplier": 0.22,
                      "attention_multiplier": 0.0625, "logits_scaling": 4.0},
              random_init=("self_attn.sinks",), family="sliding-window"),
        # minimax-01 (MiniMax-Text-01 / M1): seven lightning-attention layers (linear attention with
        # a per-head decay and a recurrent state), then a softmax-attention one (GQA 4:2, RoPE over
        # the whole head: transformers' minimax rotates all of it), each with 32 softmax-routed
        # experts (top 4, renormalised: Mixtral's routing). Eight layers, not two: the converter
        # writes no layer pattern, so llama.cpp takes MiniMax's own (every 8th layer full attention),
        # and a model of lightning layers alone has no KV cache, which llama.cpp cannot build.
        # Post-norm residuals scaled by alpha = (2 * n_layer) ** 0.25 = 2 (as the real 80 layers'
        # 3.5566), beta 1. The converter reads the alphas, betas and rotary_dim under the real
        # config.json's names (it insists the three alphas are equal and the betas 1), knows the
        # model only by the real checkpoints' class name (transformers writes MiniMaxForCausalLM),
        # has no name for the decay buffers transformers saves (dropped; its loader recomputes
        # them), and opens model.safetensors.index.json, which a one-shard save does not write.
        _arch("minimax-01", "minimax", 253, "MiniMax-Text-01, MiniMax-M1-40k, MiniMax-M1-80k",
              config={"num_hidden_layers": 8, "num_key_value_heads": 2, "head_dim": 16,
                      "intermediate_size": 128, "num_local_experts": 32, "num_experts_per_tok": 4,
                      "layer_types": ["linear_attention"] * 7 + ["full_attention"],
                      "full_attn_alpha_factor": 2.0, "linear_attn_alpha_factor": 2.0,
                      "mlp_alpha_factor": 2.0},
              saved_config={"layernorm_full_attention_alpha": 2.0, "layernorm_linear_attention_alpha": 2.0,
                            "layernorm_mlp_alpha": 2.0, "layernorm_full_attention_beta": 1.0,
                            "layernorm_linear_attention_beta": 1.0, "layernorm_mlp_beta": 1.0,
                            "rotary_dim": 16, "architectures": ["MiniMaxText01ForCausalLM"]},
              checkpoint_drop=("self_attn.slope_rate", "self_attn.query_decay", "self_attn.key_decay",
                               "self_attn.diagonal_decay"),
              checkpoint_index=True, family="lightning"),
        # qwen4exp (Qwen3.8-Flash-Next's form): a gated-DeltaNet layer, then a gated full-attention
        # layer, each followed by 32 softmax-routed experts and a sigmoid-gated shared expert.
        # Hyper-connections (hc_count residual streams mixed through a low-rank sigmoid gate) stand
        # where other models have layer norms, the last one as the output norm. PLE (per-layer n-gram
        # hash embeddings, added to the streams through a gate and a dilated causal conv) on layer 1
        # (1-based), which must be a linear-attention one: 2 n-gram orders x 2 heads of 16, each head
        # a prime-sized table of about 1000 rows (the real base is 2e7) in one checkpoint shard.
        # llama.cpp's DeltaNet gates its output norm by a sigmoid, as the real config says
        # (output_gate_type); transformers' default would be the silu of hidden_act.
        # QSA sparse attention is left dense on both sides: the pinned converter reads the config
        # through transformers, which renames the layer type "full_attention" to "indexed_attention",
        # so it writes a compress ratio of 0 for every layer and llama.cpp runs plain attention there
        # (the indexer tensors load unused); the reference's token budget (32) covers the whole
        # parity prompt, so its indexer keeps every token. Norm weights ((1 + w), zero at init) and
        # the PLE conv (zero at init) are randomised so what the converter folds is compared.
        # Linear attention keeps the 2:4 key/value head ratio with equal head dims, as qwen3next.
        _arch("qwen4exp", "qwen4_exp_text", 170, "Qwen3.8-Flash-Next (Qwen4-Exp)",
              config={"num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 128,
                      "shared_expert_intermediate_size": 128, "num_experts": 32,
                      "num_experts_per_tok": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
                      "linear_value_head_dim": 16, "linear_num_key_heads": 2,
                      "linear_num_value_heads": 4, "layer_types": ["linear_attention", "full_attention"],
                      "output_gate_type": "sigmoid", "hc_count": 4, "hc_lowrank": 16,
                      "indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 16,
                      "indexer_budget": 32, "indexer_compress_ratio": 4,
                      "ple_layer_ids": [1], "ngram_size": 3, "heads_per_ngram": 2,
                      "ngram_vocab_size_base": 1000, "ple_conv_kernel_size": 4, "split_ngram_parts": 1,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                                          "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1],
                                          "mrope_interleaved": True}},
              random_init=("hc_norm.weight", "ple.conv1d.weight", "ple.norm_key.weight",
                           "ple.norm_query.weight", "ple.norm_conv.weight", "self_attn.q_norm.weight",
                           "self_attn.k_norm.weight"),
              family="deltanet"),
        # step35 (Step-3.5-Flash's language model, as Step-3.7-Flash carries it): a leading dense
        # layer, then two MoE layers with a shared expert beside 32 routed experts, sigmoid routing
        # with a per-expert selection bias (randomised; transformers starts it at zero), weights
        # renormalised and scaled by 2.5. Attention has q/k norms and a sigmoid gate per head; the
        # middle layer is a sliding-window one (window 8, crossed by the parity prompt) with twice
        # the query heads and RoPE on the whole head, the full-attention layers rotate half of it
        # (the converter asserts exactly that pairing). The last layer clamps its SwiGLUs (routed
        # 0.5, shared 1.0, small enough to bite here), as the real model's last two layers do.
        # transformers has only the vision-language model: built whole, with a one-layer vision
        # tower the text GGUF leaves out. The converter reads the config through transformers,
        # which renames or drops the legacy keys the real config.json carries (num_attention_groups,
        # moe_num_experts, moe_top_k, norm_expert_weight, partial_rotary_factors,
        # attention_other_setting, moe_layers_enum) yet the converter needs: saved_config puts
        # them at the top of config.json, where they survive as plain attributes (the converter
        # merges text_config into the top level). Without norm_expert_weight llama.cpp would not
        # renormalise the picked weights, which transformers always does. The (1 + w) norms are
        # randomised (zero at init) so the converter's folding is compared.
        _arch("step35", "step3p7", 171, "Step-3.5-Flash, Step-3.7-Flash (language model)",
              config={"num_hidden_layers": 3, "num_attention_heads": 4, "num_sliding_attention_heads": 8,
                      "num_key_value_heads": 2, "head_dim": 16,
                      "intermediate_size": 128, "moe_intermediate_size": 128, "share_expert_dim": 128,
                      "n_routed_experts": 32, "num_experts_per_tok": 4, "sliding_window": 8,
                      "layer_types": ["full_attention", "sliding_attention", "full_attention"],
                      "mlp_layer_types": ["dense", "sparse", "sparse"],
                      "partial_rotary_factors": [0.5, 1.0, 0.5], "rope_theta": 5000000.0,
                      "moe_router_scaling_factor": 2.5, "swiglu_limits": [0.0, 0.0, 0.5],
                      "swiglu_limits_shared": [0.0, 0.0, 1.0]},
              saved_config={"num_attention_groups": 2, "partial_rotary_factors": [0.5, 1.0, 0.5],
                            "attention_other_setting": {"num_attention_heads": 8, "num_attention_groups": 2},
                            "moe_layers_enum": "1,2", "moe_num_experts": 32, "moe_top_k": 4,
                            "norm_expert_weight": True},
              outer_config={"tie_word_embeddings": False,
                            "vision_config": {"hidden_size": 32, "num_hidden_layers": 1,
                                              "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                                              "mlp_ratio": 2.0}},
              auto_class="AutoModelForImageTextToText",
              random_init=("e_score_correction_bias", "input_layernorm.weight",
                           "post_attention_layernorm.weight", "self_attn.q_norm.weight",
                           "self_attn.k_norm.weight", "language_model.norm.weight"),
              family="sliding-window"),
        # mimo2 (MiMo-V2-Flash): a leading dense layer, then MoE layers of 32 experts with no shared
        # expert, sigmoid routing with a per-expert selection bias (randomised) over one expert
        # group, weights renormalised. A full-attention layer, then two sliding-window ones (window
        # 8, crossed by the parity prompt) with twice the KV heads and attention sinks; q/k heads
        # (24) wider than v heads (16), RoPE on a third of each head (0.334 x 24 = 8) with its own
        # base per layer type, values scaled by 0.707. The converter reads the config through
        # transformers, which drops the real config.json's swa_* head sizes, topk_method and
        # hybrid_layer_pattern and keeps RoPE per layer type only, while the converter also reads
        # a flat partial_rotary_factor from rope_parameters: saved_config writes those keys back,
        # rope_parameters holding both forms (transformers reads the per-type entries). The
        # converter hard-codes the real checkpoints' 3 MTP layers, which transformers does not
        # build: "--no-mtp".
        _arch("mimo2", "mimo_v2_flash", 172, "MiMo-V2-Flash (309B-A15B)",
              config={"num_hidden_layers": 3, "num_key_value_heads": 2, "head_dim": 24, "v_head_dim": 16,
                      "intermediate_size": 128, "moe_intermediate_size": 128, "n_routed_experts": 32,
                      "num_experts_per_tok": 4, "sliding_window": 8,
                      "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
                      "mlp_layer_types": ["dense", "sparse", "sparse"],
                      "rope_parameters": _MIMO2_ROPE},
              saved_config={"swa_head_dim": 24, "swa_num_attention_heads": 4, "swa_v_head_dim": 16,
                            "swa_num_key_value_heads": 4, "topk_method": "noaux_tc",
                            "hybrid_layer_pattern": [0, 1, 1],
                            "rope_parameters": {**_MIMO2_ROPE, "rope_type": "default", "rope_theta": 5000000.0,
                                                "partial_rotary_factor": 0.334}},
              converter_args=("--no-mtp",),
              random_init=("e_score_correction_bias",),
              family="sliding-window"),
    )
}


# GLM-4.5V's vision tokens, in the order of their config ids (image_start_token_id, ...), after GLM's
# own three the converter looks up by name.
GLM_TOKENS = ("[gMASK]", "<|user|>", "<|observation|>")
GLM_VL_TOKENS = ("<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>",
                 "<|video|>")

# Vision-language models whose language model's architecture another recipe (HF_ARCHS) already lists:
# keyed by their own name (files tiny-<name>-<quant>.gguf, mmproj-<name>-f32.gguf, folder hf-<name>);
# general.architecture is the recipe's arch. The image tests (tests/gates/test_images.py,
# tests/archs/test_image_parity.py) run on these and on HF_ARCHS' own vision-language recipes
# (VL_ARCHS); the text gates run on the HF_ARCHS recipe of the same architecture.
HF_VL_ARCHS: dict[str, HfArch] = {
    # glm4vmoe: GLM-4.5V, whose language model the converter writes as glm4moe (the recipe above:
    # a leading dense layer, a shared expert, sigmoid routing with a randomised selection bias, q/k/v
    # biases, RoPE on half of each head) with M-RoPE sections (rope.dimension_sections): llama.cpp's
    # glm4moe graph then rotates by ggml_rope_multi (sectioned, not interleaved; 2+1+1 of the 4
    # rotary pairs, as the real 8+12+12 of 32) and takes image embeddings; without sections it
    # refuses them. Built as the whole vision-language model (transformers has no causal-LM class for
    # it) with a one-block vision tower (patches of 16 px, 2x2 merged by a strided convolution, then
    # the SwiGLU merger into the 64-wide text) that its --mmproj output holds (projector "glm4v").
    # Its learned position embeddings are an 8 x 8 grid both sides resample to the image's patches
    # (bicubic). No NextN block: GLM-4.5V has none. GLM-4.5V's image tokens are special tokens
    # after GLM's own (which the converter looks up by name), the config's ids pointing at them: mtmd
    # spells <|begin_of_image|> and <|end_of_image|> as one token each, as transformers does.
    "glm4vmoe": _arch(
        "glm4moe", "glm4v_moe", 260, "GLM-4.5V (language model)",
        special_tokens=GLM_TOKENS + GLM_VL_TOKENS,
        config={"vocab_size": _VOCAB + len(GLM_TOKENS) + len(GLM_VL_TOKENS), "num_hidden_layers": 3,
                "first_k_dense_replace": 1, "intermediate_size": 128, "moe_intermediate_size": 128,
                "n_routed_experts": 32, "num_experts_per_tok": 4, "n_shared_experts": 1,
                "num_key_value_heads": 2, "head_dim": 16, "attention_bias": True, "norm_topk_prob": True,
                "routed_scaling_factor": 2.5,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                    "mrope_section": [2, 1, 1]}},
        outer_config={"tie_word_embeddings": False,
                      **{f"{t}_token_id": _VOCAB + len(GLM_TOKENS) + i
                         for i, t in enumerate(("image_start", "image_end", "image", "video_start", "video_end",
                                                "video"))},
                      "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                                        "out_hidden_size": 64, "patch_size": 16, "image_size": 128,
                                        "spatial_merge_size": 2, "temporal_patch_size": 2}},
        auto_class="AutoModelForImageTextToText",
        random_init=("e_score_correction_bias",),
        # its projector: GLM-4V's processor with the tiny tower's patches (16 px, 2x2 merged), images
        # of 8 to 4096 tokens (the bounds llama.cpp's glm4v projector fixes), pixels mapped to [-1, 1]
        preprocessor={"image_processor_type": "Glm4vImageProcessor", "patch_size": 16, "merge_size": 2,
                      "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                      "size": {"shortest_edge": 8 * 32 * 32, "longest_edge": 4096 * 32 * 32}}),
}
# Every vision-language recipe the image tests run on: its name, as hf_arch takes it.
VL_ARCHS: tuple[str, ...] = ("qwen3vlmoe", "glm4vmoe")

# 256-wide variants for the K-quant gates (G23, docs/testing.md). K-quant and IQ4_XS blocks are 256
# values wide: llama.cpp's quantizer gives a row that is not a whole number of them another type
# (Q4_K -> Q5_0, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL), so the 64-wide recipes above cannot hold the
# types real GGUFs ship their experts in. Here n_embd (the expert gate/up rows) and the expert FFN
# width (the down rows) are 256; the rest is each recipe above at its smallest: 2 MoE layers (plus
# deepseek2's leading dense one), 8 experts of which 2 are used per token, so routes differ from
# token to token and every K-quant file's experts (1.6-2.5 MiB) overflow the 1 MiB eviction cache.
# Keyed by their own name (files tiny-<name>-<quant>.gguf, folder hf-<name>); general.architecture
# is the recipe's arch. Not parity-checked against transformers: the 64-wide recipes are. The init
# is half as wide as theirs so that a projection's output (fan-in 256, not 64) has the same scale.
_WIDE = {"hidden_size": 256, "initializer_range": 0.05}
HF_KQUANT_ARCHS: dict[str, HfArch] = {
    "gpt-oss-w256": _arch(
        "gpt-oss", "gpt_oss", 203, "gpt-oss-20b, gpt-oss-120b (MXFP4 experts, as they ship)",
        config={**_WIDE, "intermediate_size": 256, "num_local_experts": 8, "num_experts_per_tok": 2,
                "head_dim": 64, "num_key_value_heads": 2, "sliding_window": 8,
                "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                    "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                    "original_max_position_embeddings": 4096}},
        quants=("q4_k_m", "q6_k", "iq4_xs", "mxfp4_moe")),
    "deepseek2-w256": _arch(
        "deepseek2", "deepseek_v3", 231, "DeepSeek-V3/R1, Kimi K2, Moonlight-16B-A3B",
        config={**_WIDE, "num_hidden_layers": 3, "first_k_dense_replace": 1, "intermediate_size": 256,
                "moe_intermediate_size": 256, "n_routed_experts": 8, "num_experts_per_tok": 2,
                "n_shared_experts": 1, "n_group": 4, "topk_group": 2, "norm_topk_prob": True,
                "routed_scaling_factor": 2.5, "q_lora_rank": 32, "kv_lora_rank": 32,
                "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
                "scoring_func": "sigmoid", "topk_method": "noaux_tc"},
        quants=("q4_k_m", "q6_k", "iq4_xs"), random_init=("e_score_correction_bias",)),
    "gemma4-w256": _arch(
        "gemma4", "gemma4_text", 223, "Gemma-4-26B-A4B",
        config={**_WIDE, "vocab_size": _VOCAB + 1, "tie_word_embeddings": True, "num_key_value_heads": 2,
                "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 1,
                "attention_k_eq_v": True, "layer_types": ["sliding_attention", "full_attention"],
                "sliding_window": 8, "enable_moe_block": True, "num_experts": 8, "top_k_experts": 2,
                "moe_intermediate_size": 256, "intermediate_size": 256, "hidden_size_per_layer_input": 0,
                "final_logit_softcapping": 30.0},
        quants=("q4_k_m", "q6_k", "iq4_xs"), special_tokens=("<mask>",), tokenizer="spm-bpe",
        random_init=("router.scale", "router.per_expert_scale")),
}


def hf_arch(arch: str) -> HfArch:
    """The recipe named ``arch``: a key of HF_ARCHS (its GGUF arch), of HF_VL_ARCHS or of HF_KQUANT_ARCHS."""
    for recipes in (HF_ARCHS, HF_VL_ARCHS, HF_KQUANT_ARCHS):
        if arch in recipes:
            return recipes[arch]
    known = ", ".join(sorted([*HF_ARCHS, *HF_VL_ARCHS, *HF_KQUANT_ARCHS]))
    raise ValueError(f"no tiny HF recipe for {arch!r}; known: {known}")
