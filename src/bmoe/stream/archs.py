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
    # is not right for this arch's routing, and ``no_prefetch`` says why.
    router: str | None = None       # [n_embd, n_expert] in ggml order
    router_norm: str | None = None  # [n_embd]: what scales the router's input, element-wise
    out_node: str = "l_out"
    no_prefetch: str = ""           # why --prefetch is refused (empty where it is allowed)

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
# gate (tests/gates/test_prefetch_streaming.py); the others give the reason they refuse.
ROUTER = "ffn_gate_inp.weight"


def _entry(arch: str, resident: str, *, fused: bool = False, norm: str | None = None,
           no_prefetch: str = "") -> ArchEntry:
    if (norm is None) == (not no_prefetch):
        raise ValueError(f"{arch}: give either the router's norm or the reason --prefetch is refused")
    names = SPLIT_EXPERTS + ((FUSED_GATE_UP,) if fused else ())
    return ArchEntry(arch=arch, route_node=ROUTE_NODE, expert_tensors=names, resident=resident,
                     router=ROUTER if norm else None, router_norm=norm, no_prefetch=no_prefetch)


# An architecture is listed only when its gates run in the suite (streamed == resident bit for
# bit, decisions; tests/gates, on a tiny model of it: docs/tiny-models.md). Every entry creates
# blk.<il>.ffn_{gate,up,down}_exps.weight and builds its MoE with build_moe_ffn.
_REGISTRY: dict[str, ArchEntry] = {
    e.arch: e
    for e in (
        # qwen3moe: ffn_norm, then build_moe_ffn(..., SOFTMAX) without exp_probs_b or gate_inp_b.
        _entry("qwen3moe", "router", norm="ffn_norm.weight"),
        # qwen35moe: attn_post_norm ("post_attention_norm"), then build_layer_ffn -> build_moe_ffn(SOFTMAX).
        _entry("qwen35moe", "router, shared expert, linear-attention state", fused=True,
               norm="post_attention_norm.weight"),
        # qwen2moe: ffn_norm, then build_moe_ffn(SOFTMAX); the shared expert runs beside it.
        _entry("qwen2moe", "router, shared expert (ffn_*_shexp) and its gate", norm="ffn_norm.weight"),
        # olmoe: ffn_norm, then build_moe_ffn(SOFTMAX).
        _entry("olmoe", "router", norm="ffn_norm.weight"),
        # -- group A: gpt-oss, lfm2moe, granite --
        # -- group B: gemma4, mixtral, qwen3next --
        # -- group C: deepseek2, glm4moe, then the stretch list --
    )
}
# Not listed until a tiny model of each runs the gates (issue #13): qwen3next, gpt-oss (routing
# adds gate_inp_b; per-expert biases stay resident), lfm2moe (sigmoid routing with exp_probs_b;
# leading dense layers), and the rest of docs/streaming.md's list.


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
