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

from bmoe.testing.ggml_rounding import GELU_FP16

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
    "kda": "Kimi delta attention (KDA) linear attention beside MLA attention (recurrent state)",
    "short-conv": "short-convolution layers beside attention (recurrent state)",
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

    def hf_config(self) -> dict[str, Any]:
        text = {**_SMALL, **self.config}
        return text if self.outer_config is None else {**self.outer_config, "text_config": text}


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
        _arch("mistral4", "mistral3", 140, "Mistral-Small-4-119B",
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
    )
}


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
    """The recipe named ``arch``: a key of HF_ARCHS (its GGUF arch) or of HF_KQUANT_ARCHS."""
    try:
        return HF_ARCHS[arch] if arch in HF_ARCHS else HF_KQUANT_ARCHS[arch]
    except KeyError:
        known = ", ".join(sorted([*HF_ARCHS, *HF_KQUANT_ARCHS]))
        raise ValueError(f"no tiny HF recipe for {arch!r}; known: {known}") from None
