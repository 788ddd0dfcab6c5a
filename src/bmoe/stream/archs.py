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
    arch: str                       # general.architecture as written in the GGUF
    route_node: str                 # graph node prefix; the full name is f"{route_node}-{il}"
    expert_tensors: tuple[str, ...]  # per-layer tensor names (after "blk.<il>.") that stream
    resident: str                   # what stays in RAM besides the dense weights, for people
    # Speculative prefetch (--prefetch): the router weight and the RMS-norm weight right before it,
    # per layer "blk.<il>.<name>", and the node that ends a layer ("l_out-<il>"). None: the guess
    # is not known to be right for this arch, so --prefetch is refused for it.
    router: str | None = None       # [n_embd, n_expert] in ggml order
    router_norm: str | None = None  # [n_embd]: what scales the router's input, element-wise
    out_node: str = "l_out"

    @property
    def can_prefetch(self) -> bool:
        return self.router is not None and self.router_norm is not None

    def route_name(self, il: int) -> str:
        return f"{self.route_node}-{il}"

    def streams(self, tensor_suffix: str) -> bool:
        return tensor_suffix in self.expert_tensors


def _entry(arch: str, resident: str, *, fused: bool = False, norm: str | None = None) -> ArchEntry:
    names = SPLIT_EXPERTS + ((FUSED_GATE_UP,) if fused else ())
    return ArchEntry(arch=arch, route_node=ROUTE_NODE, expert_tensors=names, resident=resident,
                     router=ROUTER if norm else None, router_norm=norm)


# The router (build_moe_ffn's gate_inp) of every registry arch is "blk.<il>.ffn_gate_inp.weight".
# --prefetch guesses layer l+1's experts as the top n_expert_used of router . (l_out-<l> * norm):
# right only where the router's input is rms_norm(x) * norm with no bias, and the pick is the top
# k of softmax(logits) (the same as the top k of the logits). Checked in src/models/<arch>.cpp:
# qwen3moe: ffn_norm, then build_moe_ffn(..., SOFTMAX) without exp_probs_b or gate_inp_b.
# qwen35moe: attn_post_norm ("post_attention_norm"), then build_layer_ffn -> build_moe_ffn(SOFTMAX).
# The others are left out: not checked (qwen3next, olmoe, lfm2moe), or their routing has a bias
# (gpt-oss: gate_inp_b; lfm2moe: exp_probs_b).
ROUTER = "ffn_gate_inp.weight"


# Checked against src/models/<arch>.cpp of the vendored llama.cpp (0.3.36): every entry
# creates blk.<il>.ffn_{gate,up,down}_exps.weight and builds its MoE with build_moe_ffn.
_REGISTRY: dict[str, ArchEntry] = {
    e.arch: e
    for e in (
        _entry("qwen3moe", "router", norm="ffn_norm.weight"),
        _entry("qwen35moe", "router, shared expert, linear-attention state", fused=True,
               norm="post_attention_norm.weight"),
        _entry("qwen3next", "router, shared expert, linear-attention state", fused=True),
        _entry("qwen2moe", "router, shared expert (ffn_*_shexp) and its gate"),
        _entry("olmoe", "router"),
        # gpt-oss adds per-expert biases (ffn_*_exps.bias, [n_ff, n_expert]); they are a few
        # KiB per layer, applied with ggml_add_id after the matmul, and stay resident.
        _entry("gpt-oss", "router and expert biases (ffn_*_exps.bias)"),
        # lfm2moe's first n_layer_dense_lead layers are dense; the layout finds which carry experts.
        _entry("lfm2moe", "router, leading dense layers, short convolutions"),
    )
}


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
        lines.append(f"{e.arch:<10} route={e.route_node}-<il>  streams={names}  resident: {e.resident}{pre}")
    return "\n".join(lines)
