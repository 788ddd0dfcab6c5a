"""Which architectures bmoe can stream, and how their graphs name the routing and the experts.

Only names live here. Expert counts, shapes and which layers carry experts come from the
GGUF itself (see layout.py), so a new model of a known arch needs no code change.
"""

from __future__ import annotations

from dataclasses import dataclass

from bmoe.errors import ModelFileError

# Every MoE arch in the pinned llama.cpp routes through the shared MoE builder, which names
# the selected-expert node "ffn_moe_topk-<il>" (src/llama-graph.cpp, build_moe_ffn).
ROUTE_NODE = "ffn_moe_topk"
# The routing weights it gathers by those ids ("ffn_moe_weights-<il>", get_rows(probs, ids)); the
# builder expands it into the graph before the expert matmuls, so in its data call the ids have
# been read by everything but the matmuls (and the expert-indexed biases or scales some archs
# gather after it: SlotCache refuses those, cache.slots_refusal).
WEIGHTS_NODE = "ffn_moe_weights"

# Stacked expert weights, per layer "blk.<il>.<name>": [n_embd|n_ff, n_ff|n_embd, n_expert].
# gate_up is the fused variant some converters write (qwen35moe/qwen3next accept either).
SPLIT_EXPERTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
FUSED_GATE_UP = "ffn_gate_up_exps.weight"


class UnsupportedArchError(ModelFileError, ValueError):
    """The model's architecture has no streaming entry in the registry."""


class NothingToStreamError(ModelFileError, ValueError):
    """The model has no expert tensors (a dense model): there is nothing to stream."""


@dataclass(frozen=True, slots=True)
class ArchEntry:
    arch: str  # general.architecture as written in the GGUF
    route_node: str  # graph node prefix; the full name is f"{route_node}-{il}"
    expert_tensors: tuple[str, ...]  # per-layer tensor names (after "blk.<il>.") that stream
    resident: str  # what stays in RAM besides the dense weights, for people
    # Speculative prefetch (--prefetch): the router weight and the RMS-norm weight right before it,
    # per layer "blk.<il>.<name>", and the node that ends a layer ("l_out-<il>"). None: the guess
    # is not right for this arch's routing, and ``why_no_prefetch`` says why.
    router: str | None = None  # [n_embd, n_expert] in ggml order
    router_norm: str | None = None  # [n_embd]: what scales the router's input, element-wise
    out_node: str = "l_out"
    # The residual stream entering a layer's FFN ("<inp_node>-<il>", [n_embd, n_tokens]): the early
    # guess of layer il+1 reads it at layer il's route, before layer il's experts have run.
    inp_node: str = "ffn_inp"
    why_no_prefetch: str = ""  # why --prefetch is refused (empty where it is allowed)
    # Why a decide batch of this arch is answered one by one instead of side by side on forked
    # side sequences (empty where batching is exact): docs/decide.md "What is exact".
    why_batch_apart: str = ""

    @property
    def can_prefetch(self) -> bool:
        return self.router is not None and self.router_norm is not None

    def route_name(self, il: int) -> str:
        return f"{self.route_node}-{il}"

    def streams(self, tensor_suffix: str) -> bool:
        return tensor_suffix in self.expert_tensors


# The router (build_moe_ffn's gate_inp) of every registry arch is "blk.<il>.ffn_gate_inp.weight".
# --prefetch guesses layer l+1's experts as the top n_expert_used of router . (l_out-<l> * norm):
# right only where the router's input is rms_norm(x) * norm with no bias, and the pick is the top
# k of softmax(logits) (the same as the top k of the logits). Each entry below that allows it was
# checked against src/models/<arch>.cpp of the vendored llama.cpp (0.3.36) and runs the prefetch
# gate (tests/gates/test_prefetch_streaming.py); the others give the reason they refuse. ``inp``
# names the residual entering the FFN where a builder does not call it ffn_inp (the early guess
# reads it; the prefetch gate checks that it was found on every layer it guesses).
ROUTER = "ffn_gate_inp.weight"


def _entry(
    arch: str,
    resident: str,
    *,
    fused: bool = False,
    norm: str | None = None,
    inp: str = "ffn_inp",
    why_no_prefetch: str = "",
    batch_apart: str = "",
) -> ArchEntry:
    if (norm is None) == (not why_no_prefetch):
        raise ValueError(f"{arch}: give either the router's norm or the reason --prefetch is refused")
    names = SPLIT_EXPERTS + ((FUSED_GATE_UP,) if fused else ())
    return ArchEntry(
        arch=arch,
        route_node=ROUTE_NODE,
        expert_tensors=names,
        resident=resident,
        router=ROUTER if norm else None,
        router_norm=norm,
        inp_node=inp,
        why_no_prefetch=why_no_prefetch,
        why_batch_apart=batch_apart,
    )


# An architecture is listed only when its gates run in the suite (streamed == resident bit for
# bit, decisions; tests/gates, on a tiny model of it: docs/tiny-models.md). Every entry creates
# blk.<il>.ffn_{gate,up,down}_exps.weight and builds its MoE with build_moe_ffn.
_REGISTRY: dict[str, ArchEntry] = {
    e.arch: e
    for e in (
        # qwen3moe: ffn_norm, then build_moe_ffn(..., SOFTMAX) without exp_probs_b or gate_inp_b.
        _entry("qwen3moe", "router", norm="ffn_norm.weight"),
        # qwen35moe: attn_post_norm ("post_attention_norm"), then build_layer_ffn -> build_moe_ffn(SOFTMAX).
        _entry(
            "qwen35moe",
            "router, shared expert, linear-attention state",
            fused=True,
            norm="post_attention_norm.weight",
            inp="attn_residual",
        ),
        # qwen2moe: ffn_norm, then build_moe_ffn(SOFTMAX); the shared expert runs beside it.
        _entry("qwen2moe", "router, shared expert (ffn_*_shexp) and its gate", norm="ffn_norm.weight"),
        # olmoe: ffn_norm, then build_moe_ffn(SOFTMAX).
        _entry("olmoe", "router", norm="ffn_norm.weight"),
        # gpt-oss (openai-moe.cpp): post_attention_norm, then build_moe_ffn(SOFTMAX_WEIGHT) with
        # ffn_gate_inp.bias added to the router's logits and a bias per expert and projection
        # (ffn_{gate,up,down}_exps.bias, [n, n_expert]): those biases are small and stay resident.
        _entry(
            "gpt-oss",
            "router and its bias, per-expert biases (ffn_*_exps.bias), attention sinks",
            why_no_prefetch="its router adds a bias (ffn_gate_inp.bias) to the logits, which the guess leaves out",
        ),
        # lfm2moe (lfm2.cpp): ffn_norm, then build_moe_ffn with SIGMOID gating (the GGUF's
        # expert_gating_func) and exp_probs_b added to the probabilities before the pick; the
        # leading dense layers (leading_dense_block_count) carry no experts and load whole.
        _entry(
            "lfm2moe",
            "router and its per-expert bias (exp_probs_b), leading dense layers, short-convolution state",
            why_no_prefetch="its routing is a sigmoid plus a per-expert bias (exp_probs_b) the guess leaves out",
        ),
        # granitehybrid (granite-hybrid.cpp): ffn_norm on ffn_inp, then build_moe_ffn(SOFTMAX)
        # without exp_probs_b or gate_inp_b; the shared expert (ffn_*_shexp) runs beside it.
        _entry("granitehybrid", "router, shared expert (ffn_*_shexp), Mamba2 state", norm="ffn_norm.weight"),
        # qwen3next: post_attention_norm, then build_layer_ffn -> build_moe_ffn(SOFTMAX) without
        # exp_probs_b or gate_inp_b; the sigmoid-gated shared expert runs beside it. Split or
        # fused gate_up experts (create_tensor_gate_up_exps takes either).
        _entry(
            "qwen3next",
            "router, shared expert (ffn_*_shexp) and its sigmoid gate, linear-attention (gated DeltaNet) state",
            fused=True,
            norm="post_attention_norm.weight",
            inp="attn_residual",
        ),
        # llama with experts (Mixtral; llama.cpp's src/models/llama.cpp): ffn_norm, then
        # build_moe_ffn(SOFTMAX) without exp_probs_b or gate_inp_b. A llama GGUF without expert
        # tensors (Llama, Mistral, SmolLM2) never reaches the registry: read_layout refuses it as
        # dense first, so this entry only ever streams a file that has experts.
        _entry(
            "llama",
            "router (Mixtral; a llama file without experts is dense: nothing to stream)",
            norm="ffn_norm.weight",
        ),
        # gemma4 (src/models/gemma4.cpp): the router's input is rms_norm(attn_out) / sqrt(n_embd) *
        # ffn_gate_inp.scale, no bias, and build_moe_ffn(SOFTMAX) picks the top k of those logits:
        # a positive constant apart, the guess's rms_norm(x) * norm with ffn_gate_inp.scale as the
        # norm. The per-expert output scale (ffn_down_exps.scale) weighs the picks, not the choice.
        # Experts are written with gate and up fused.
        _entry(
            "gemma4",
            "router and its input scale (ffn_gate_inp.scale), per-expert output scales "
            "(ffn_down_exps.scale), the dense GELU MLP every layer runs beside its experts",
            fused=True,
            norm="ffn_gate_inp.scale",
            inp="attn_out",
        ),
        # deepseek2: ffn_norm, then build_moe_ffn with exp_probs_b and hparams' gating function
        # (sigmoid for V3/Kimi/Moonlight, softmax for V2) over group-limited top-k; shared expert beside.
        _entry(
            "deepseek2",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), leading dense layers",
            why_no_prefetch="its routing adds a per-expert selection bias (exp_probs_b) and keeps only "
            "the best expert groups, which the guess leaves out",
        ),
        # glm4moe: post_attention_norm, then build_moe_ffn(SIGMOID) with exp_probs_b; shared expert
        # beside. The NextN block after the last layer is never computed (layout.py leaves it out).
        _entry(
            "glm4moe",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), leading dense layers",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out",
        ),
        # dots1: ffn_norm, then build_moe_ffn with exp_probs_b and the GGUF's gating function
        # (sigmoid); shared experts beside.
        _entry(
            "dots1",
            "router, selection bias (exp_probs_b), shared experts (ffn_*_shexp), leading dense layers",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out",
        ),
        # minimax-m2: ffn_norm, then build_moe_ffn with exp_probs_b and the GGUF's gating function
        # (sigmoid); no shared expert.
        _entry(
            "minimax-m2",
            "router, selection bias (exp_probs_b)",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out",
        ),
        # llama4 (src/models/llama4.cpp): on its MoE layers ffn_norm, then build_moe_ffn(SIGMOID)
        # without exp_probs_b or gate_inp_b, whose pick for llama4 is the top k of the raw logits
        # (the sigmoid only weighs the pick, on the expert's input): the guess's own rule. The
        # dense layers between (every layer when the interleave step is 1) carry no experts; the
        # hook guesses a MoE layer from the l_out of whatever layer comes before it.
        _entry(
            "llama4", "router, shared expert (ffn_*_shexp), the dense layers between MoE layers", norm="ffn_norm.weight"
        ),
        # qwen3vlmoe (the language model of Qwen3-VL; src/models/qwen3vlmoe.cpp): qwen3moe's layer,
        # ffn_norm, then build_moe_ffn(SOFTMAX) without exp_probs_b or gate_inp_b. On its first
        # n_deepstack layers the layer's output (l_out) gets a deepstack slice of the input
        # embedding added (deepstack_out): zero for text tokens, so the guess from l_out is the
        # next layer's input there; with image embeddings it is a guess, as everywhere.
        _entry("qwen3vlmoe", "router", norm="ffn_norm.weight"),
        # ernie4_5-moe (src/models/ernie4-5-moe.cpp): after the leading dense layers, every
        # n_moe_layer_step-th layer: ffn_norm, then build_moe_ffn(SOFTMAX) with exp_probs_b added to
        # the probabilities for the pick (not the weights); the shared experts run beside it.
        _entry(
            "ernie4_5-moe",
            "router, selection bias (exp_probs_b), shared experts (ffn_*_shexp), leading dense layers",
            why_no_prefetch="its routing adds a per-expert selection bias (exp_probs_b) to the "
            "probabilities before the pick, which the guess leaves out",
        ),
        # hunyuan-moe (src/models/hunyuan-moe.cpp): ffn_norm, then a shared MLP (ffn_*_shexp)
        # and build_moe_ffn(SOFTMAX) without exp_probs_b or gate_inp_b side by side.
        _entry("hunyuan-moe", "router, shared expert (ffn_*_shexp)", norm="ffn_norm.weight"),
        # granitemoe (Granite 3.x; src/models/granite.cpp's build_layer_ffn, which granite-moe.cpp
        # uses): ffn_norm on ffn_inp, then build_moe_ffn(SOFTMAX) without exp_probs_b or
        # gate_inp_b; the GraniteMoeShared form adds a shared expert (ffn_*_shexp) beside it.
        _entry(
            "granitemoe",
            "router (and the shared expert, ffn_*_shexp, of GraniteMoeShared files)",
            norm="ffn_norm.weight",
        ),
        # mistral4 (Mistral-Small-4; llama.cpp builds it with deepseek2's graph, models.h's
        # llama_model_mistral4 : llama_model_deepseek2): ffn_norm, then build_moe_ffn with the GGUF's
        # gating function (softmax) over group-limited top-k; shared expert beside; experts written
        # with gate and up fused (ffn_gate_up_exps).
        _entry(
            "mistral4",
            "router, shared expert (ffn_*_shexp)",
            fused=True,
            why_no_prefetch="its routing keeps only the best expert groups, which the guess leaves out",
        ),
        # nemotron_h_moe (Nemotron 3 Nano; src/models/nemotron-h.cpp, whose graph nemotron-h-moe.cpp
        # builds): each block is a Mamba2 layer, an attention layer or a MoE layer. On a MoE block,
        # attn_norm, then build_moe_ffn(SIGMOID) with exp_probs_b over ffn_up_exps and
        # ffn_down_exps only (no gate: ReLU^2 experts), and a shared expert (ffn_*_shexp) beside it;
        # the optional latent projections (ffn_latent_down/up, Nemotron 3 Super) are dense.
        # The blocks without experts load whole. (Its "l_out" is the FFN's output, not the block's.)
        _entry(
            "nemotron_h_moe",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), "
            "the Mamba2 and attention blocks between MoE blocks, Mamba2 state",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out",
        ),
        # jamba (src/models/jamba.cpp): on the layers with a router (ffn_gate_inp), ffn_norm on the
        # residual, then build_moe_ffn(SOFTMAX) without exp_probs_b or gate_inp_b, weights not
        # renormalised; the other layers run a dense SwiGLU FFN and load whole. The router's input
        # would suit the guess, but the builder names its mixer's output "ffn_inp" (cb(cur, ...)
        # after the residual add is made from it), so no node holds the residual entering the FFN
        # that the read-ahead guess reads.
        _entry(
            "jamba",
            "router, the dense FFN layers between MoE layers, Mamba state",
            why_no_prefetch="its graph names no node for the residual entering the FFN (the node it "
            "calls ffn_inp is the Mamba/attention output), which the read-ahead guess reads",
        ),
        # bailingmoe3 (Ling 3.0; src/models/bailingmoe3.cpp): after the leading dense layers,
        # ffn_norm on the residual, then build_moe_ffn with exp_probs_b, the GGUF's gating function
        # (sigmoid) and the expert groups (expert_group_count/used_count) llama.cpp reads for every
        # arch; the shared expert runs beside it. The layers' token mixing is KDA (linear
        # attention) or gated MLA.
        _entry(
            "bailingmoe3",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), leading dense layers, KDA state",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "over group-limited top-k, which the guess leaves out",
        ),
        # kimi-linear (src/models/kimi-linear.cpp): KDA (recurrent) and MLA layers alike end in
        # ffn_norm on ffn_inp, then build_moe_ffn with exp_probs_b and the GGUF's gating function
        # (sigmoid for Kimi-Linear), weights renormalised and scaled; the shared expert beside it.
        # The leading dense layers (leading_dense_block_count) carry no experts.
        _entry(
            "kimi-linear",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), "
            "leading dense layers, KDA (linear-attention) state",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out",
        ),
        # minimax-m3 (src/models/minimax-m3.cpp; the language model of MiniMax-M3): after the leading
        # dense layers, ffn_norm on ffn_inp, then build_moe_ffn(SWIGLU_OAI_MOE) with exp_probs_b and
        # the GGUF's gating function (sigmoid), weights renormalised and scaled; the shared expert
        # beside it. Attention on the MoE layers is MiniMax sparse attention when flash attention is
        # on (an indexer, blk.<il>.indexer.*, picks key blocks), dense otherwise; no expert tensors.
        _entry(
            "minimax-m3",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), "
            "sparse-attention indexer, leading dense layers",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out",
        ),
        # glm5-next (src/models/glm5-next.cpp): the layer's residual is 4 mHC streams
        # ([n_embd, 4, n_tokens]); hc_ffn_pre collapses them with learned weights, then ffn_norm and
        # build_moe_ffn with exp_probs_b and the GGUF's gating function (sigmoid); the shared
        # expert runs beside it. KDA layers keep a recurrent state, the MLA layers a latent cache
        # and the DSA indexer's key/pool cache; leading dense layers carry no experts.
        _entry(
            "glm5-next",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), mHC "
            "mixing weights, DSA indexer, KDA state, leading dense layers",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b), and "
            "the router reads a learned mix of four residual streams, not l_out",
            batch_apart="its pooled DSA indexer picks other tokens for a suffix on a forked side sequence "
            "than alone once the context is past its top-k",
        ),
        # glm-dsa (src/models/glm-dsa.cpp): DeepSeek-V3.2-style MLA whose lightning indexer's top-k
        # masks the attention (shared-indexer layers reuse the previous full layer's pick); then
        # ffn_norm on ffn_inp and build_moe_ffn with exp_probs_b and the GGUF's gating function
        # (sigmoid); shared expert beside. The NextN block is never computed (layout.py leaves it out).
        _entry(
            "glm-dsa",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), DSA "
            "indexer and its key cache, leading dense layers",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out",
        ),
        # exaone-moe (K-EXAONE; src/models/exaone-moe.cpp): after the leading dense layers,
        # ffn_norm, then build_moe_ffn with exp_probs_b and the GGUF's gating function (sigmoid),
        # weights renormalised and scaled; the shared expert (ffn_*_shexp) runs beside it. The
        # NextN layers after the trunk carry a dense FFN, no experts, and are never computed.
        _entry(
            "exaone-moe",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), leading dense layers",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out",
        ),
        # afmoe (Arcee Trinity; src/models/afmoe.cpp): after the leading dense layers, ffn_norm, then
        # build_moe_ffn with exp_probs_b and sigmoid gating (the GGUF's, sigmoid by default),
        # weights renormalised and scaled; the shared expert (ffn_*_shexp) runs beside it and
        # ffn_post_norm scales their sum.
        _entry(
            "afmoe",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), leading dense layers",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out",
        ),
        # cohere2moe (src/models/cohere2moe.cpp): a parallel block. attn_norm (RMS when the GGUF
        # has layer_norm_rms_epsilon, else a bias-free LayerNorm) feeds both the attention and
        # build_moe_ffn (the GGUF's gating function, sigmoid by default; no exp_probs_b or
        # gate_inp_b), whose pick is the top k of the raw logits; the shared expert runs beside and
        # the two are averaged. So the router's input is rms_norm(layer input) * attn_norm, and the
        # guess from l_out-<l> is the very input of layer l+1 (a LayerNorm file's guess leaves out
        # the mean, a guess only). The builder names no residual before the FFN (the layer's input
        # is the previous l_out): the early guess reads the normed input, attn_norm-<l>, which the
        # experts read after the route. The leading dense layers carry no experts.
        _entry(
            "cohere2moe",
            "router, shared expert (ffn_*_shexp), leading dense layers",
            norm="attn_norm.weight",
            inp="attn_norm",
        ),
        # dbrx (src/models/dbrx.cpp): attn_out_norm, a LayerNorm (LLM_NORM), on ffn_inp, then
        # build_moe_ffn(SOFTMAX, weights renormalised) without exp_probs_b or gate_inp_b; every
        # layer is MoE, nothing shared.
        _entry(
            "dbrx",
            "router",
            why_no_prefetch="its router reads a LayerNorm (attn_out_norm), which takes out the mean "
            "the guess's RMS norm keeps",
        ),
        # deepseek4 (src/models/deepseek4.cpp): hyper-connections (hc_ffn_pre) mix the residual
        # streams, ffn_norm, then build_moe_ffn with the sqrt-softplus gating and exp_probs_b; the
        # first hash_layer_count layers pick their experts from ffn_gate_tid2eid[token] instead (the
        # router still weights them); shared expert beside, routed experts always SwiGLU-clamped.
        _entry(
            "deepseek4",
            "router, selection bias (exp_probs_b), hash-routing table "
            "(ffn_gate_tid2eid), shared expert (ffn_*_shexp), hyper-connection mixers (hc_*), "
            "compressor and indexer weights",
            why_no_prefetch="its routing scores are sqrt(softplus) with a per-expert selection bias, "
            "and its hash layers pick by token id, neither of which the guess follows",
        ),
        # mellum (src/models/mellum.cpp): ffn_norm on ffn_inp, then build_moe_ffn(SOFTMAX, weights
        # renormalised) without exp_probs_b or gate_inp_b on every layer; nothing shared.
        _entry("mellum", "router", norm="ffn_norm.weight"),
        # hy_v3 (Tencent Hy3; src/models/hy-v3.cpp): ffn_norm, then on layers with a router
        # build_moe_ffn with exp_probs_b and the GGUF's gating function (sigmoid) beside an ungated
        # shared expert (ffn_*_shexp); layers without a router (the leading dense ones) run a dense
        # FFN. The NextN block after the last layer is never computed by the trunk graph.
        _entry(
            "hy_v3",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), leading dense layer",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out",
        ),
        # hy_v4 (Tencent Hy4; src/models/hy-v4.cpp): the layer's hyper-connection streams are mixed
        # (hc_ffn_*), then ffn_norm; after the leading dense layers (leading_dense_block_count)
        # build_moe_ffn with exp_probs_b and the GGUF's gating function (sigmoid), the shared
        # expert (ffn_*_shexp) beside it. The residual is hc streams wide: no ffn_inp node.
        _entry(
            "hy_v4",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), "
            "leading dense layer, hyper-connection mixers, sparse-attention indexers",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out, and its residual is several hyper-connection streams mixed "
            "per layer",
        ),
        # laguna (poolside Laguna; src/models/laguna.cpp): ffn_norm on ffn_inp, then after the
        # leading dense layers build_moe_ffn with exp_probs_b and the GGUF's gating function
        # (sigmoid), the shared expert (ffn_*_shexp) beside it.
        _entry(
            "laguna",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), leading dense layer",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out",
        ),
        # minimax-01 (MiniMax-Text-01 / M1; src/models/minimax-01.cpp): ffn_norm on ffn_inp, then
        # build_moe_ffn(SOFTMAX, weights renormalised) without exp_probs_b (the loader creates none)
        # or gate_inp_b. The residuals are post-norm and scaled (residual_scale): l_out is the
        # experts' output plus the scaled ffn_norm output, so the guess from it is a guess, as
        # everywhere. Lightning-attention layers keep a recurrent state per sequence.
        _entry("minimax-01", "router, lightning-attention state", norm="ffn_norm.weight"),
        # granite_swa with experts (GraniteMoeSWA; src/models/granite-swa.cpp's build_layer_ffn):
        # ffn_norm on ffn_inp, then build_moe_ffn(SOFTMAX) without exp_probs_b or gate_inp_b, experts
        # with gate and up fused (ffn_gate_up_exps); the shared expert (ffn_*_shexp) beside it. A
        # granite_swa file without experts is dense and never reaches the registry.
        _entry(
            "granite_swa", "router, shared expert (ffn_*_shexp), attention sinks", fused=True, norm="ffn_norm.weight"
        ),
        # qwen4exp (src/models/qwen4exp.cpp): build_layer_ffn -> build_moe_ffn(SOFTMAX) without
        # exp_probs_b or gate_inp_b, beside a sigmoid-gated shared expert; split or fused gate_up
        # experts (create_tensor_gate_up_exps). Its input is a hyper-connection mix (build_hc_mix:
        # the RMS-normed residual streams weighted by a sigmoid gate computed from them, then
        # averaged), not one RMS norm of one residual. The PLE n-gram table stays resident too.
        _entry(
            "qwen4exp",
            "router, shared expert (ffn_*_shexp) and its sigmoid gate, hyper-connection "
            "mixers, PLE n-gram table, linear-attention (gated DeltaNet) state",
            fused=True,
            why_no_prefetch="its router reads a hyper-connection mix of several residual streams "
            "(gated by weights computed from them), not rms_norm(x) * norm of one residual",
        ),
        # step35 (Step-3.5/3.7-Flash; src/models/step35.cpp): ffn_norm, then on MoE layers
        # build_moe_ffn with exp_probs_b and the GGUF's gating function (sigmoid when unset), its
        # SwiGLU clamped per layer (swiglu_clamp_exp), and the shared expert beside it; layers
        # without a router run a dense MLP.
        _entry(
            "step35",
            "router, selection bias (exp_probs_b), shared expert (ffn_*_shexp), leading dense layers",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out",
        ),
        # mimo2 (MiMo-V2-Flash; src/models/mimo2.cpp): ffn_norm, then on MoE layers
        # build_moe_ffn(SIGMOID) with exp_probs_b, no shared expert; layers without a router run a
        # dense MLP. Sliding-window layers carry attention sinks (attn_sinks). The NextN blocks of
        # the real files are never computed (layout.py leaves them out).
        _entry(
            "mimo2",
            "router, selection bias (exp_probs_b), attention sinks, leading dense layer",
            why_no_prefetch="its routing is a sigmoid with a per-expert selection bias (exp_probs_b) "
            "the guess leaves out",
        ),
    )
}
# Every other MoE architecture of the pinned llama.cpp is refused, each for a reason docs/streaming.md
# ("Refused architectures") names: no tiny model could be made and checked here, or no generative model.


def batch_apart(arch: str) -> str:
    """Why decisions of ``arch`` are not batched side by side (empty: they are); an arch outside
    the registry has nothing against it."""
    entry = _REGISTRY.get(arch)
    return "" if entry is None else entry.why_batch_apart


def lookup(arch: str) -> ArchEntry:
    """The registry entry for ``arch``, or UnsupportedArchError naming it."""
    try:
        return _REGISTRY[arch]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise UnsupportedArchError(
            f"expert streaming does not support architecture '{arch}' (supported: {known}); "
            "open it without moe_stream to load it resident"
        ) from None


def list_archs() -> tuple[ArchEntry, ...]:
    return tuple(_REGISTRY[a] for a in sorted(_REGISTRY))


def format_archs() -> str:
    """The text `bmoe-cli --list-archs` prints: one arch per line."""
    lines = []
    for e in list_archs():
        names = ", ".join(n.removesuffix(".weight") for n in e.expert_tensors)
        pre = "  prefetch" if e.can_prefetch else ""
        lines.append(f"{e.arch:<13} route={e.route_node}-<il>  streams={names}  resident: {e.resident}{pre}")
    return "\n".join(lines)
