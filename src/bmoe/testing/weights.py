"""The random weights of a tiny fixture, in Hugging Face form.

This is the single source of the numbers: the GGUF writer converts this state dict by llama.cpp's
converter rules (``convert.py``), and the reference test loads the very same dict into
transformers' ``Qwen3MoeForCausalLM`` / ``Qwen3_5MoeForCausalLM``. Agreement between the two
therefore checks the conversion, not two independent random draws.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from bmoe.testing.spec import TinySpec

# Scale of the tied embedding: final hidden states have RMS ~1, so logits get a standard deviation
# of about sqrt(n_embd) * 0.2 = 3.2, a peaked but not degenerate next-token distribution.
_EMBED_STD = 0.2
# Spread of RMSNorm gains around their neutral value, so a swapped or missing "+1" shows up.
_NORM_SPREAD = 0.1


@dataclass(frozen=True, slots=True)
class HfWeights:
    """``config`` is the kwargs of the transformers config class; ``state_dict`` maps HF
    parameter names to float32 arrays with HF shapes (``[out, in]`` for linear layers)."""

    model_type: str
    config: dict[str, object]
    state_dict: dict[str, np.ndarray]


def _rng(spec: TinySpec, name: str) -> np.random.Generator:
    # One stream per tensor, keyed by name: a tensor's values do not depend on generation order.
    return np.random.default_rng([spec.seed, zlib.crc32(name.encode())])


def _normal(spec: TinySpec, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    x = _rng(spec, name).standard_normal(shape, dtype=np.float32)
    return (x * np.float32(std)).astype(np.float32, copy=False)


def _linear(spec: TinySpec, name: str, n_out: int, n_in: int) -> np.ndarray:
    return _normal(spec, name, (n_out, n_in), 1.0 / np.sqrt(n_in))


def _norm(spec: TinySpec, name: str, n: int, zero_centered: bool) -> np.ndarray:
    # Qwen3.5's RMSNorm multiplies by (1 + w): its neutral weight is 0, plain RMSNorm's is 1.
    w = _normal(spec, name, (n,), _NORM_SPREAD)
    return w if zero_centered else (w + np.float32(1.0))


def hf_config(spec: TinySpec) -> tuple[str, dict[str, object]]:
    """(model_type, kwargs for the transformers config class)."""
    common: dict[str, object] = dict(
        vocab_size=spec.n_vocab,
        hidden_size=spec.n_embd,
        num_hidden_layers=spec.n_layer,
        num_attention_heads=spec.n_head,
        num_key_value_heads=spec.n_head_kv,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.n_ctx_train,
        rms_norm_eps=spec.rms_eps,
        num_experts=spec.n_expert,
        num_experts_per_tok=spec.n_expert_used,
        moe_intermediate_size=spec.n_ff_exp,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    if spec.linear is None:
        common.update(
            intermediate_size=spec.n_ff_exp * spec.n_expert_used,
            # llama.cpp's qwen3moe graph always renormalises the top-k weights.
            norm_topk_prob=True,
            rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        )
        return spec.flavour.model_type, common
    lin = spec.linear
    assert lin is not None
    common.update(
        shared_expert_intermediate_size=spec.n_ff_shexp,
        layer_types=list(spec.layer_types),
        linear_num_key_heads=lin.n_k_heads,
        linear_num_value_heads=lin.n_v_heads,
        linear_key_head_dim=lin.head_k_dim,
        linear_value_head_dim=lin.head_v_dim,
        linear_conv_kernel_dim=lin.conv_kernel,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": spec.rope_theta,
            "partial_rotary_factor": spec.partial_rotary,
            "mrope_section": list(spec.mrope_section),
            "mrope_interleaved": True,
        },
    )
    return spec.flavour.model_type, common


def _moe_block(spec: TinySpec, p: str, sd: dict[str, np.ndarray]) -> None:
    e, d, f = spec.n_expert, spec.n_embd, spec.n_ff_exp
    sd[f"{p}.mlp.gate.weight"] = _linear(spec, f"{p}.mlp.gate.weight", e, d)
    # transformers 5 stores the experts fused: gate rows then up rows.
    sd[f"{p}.mlp.experts.gate_up_proj"] = _normal(
        spec, f"{p}.mlp.experts.gate_up_proj", (e, 2 * f, d), 1.0 / np.sqrt(d)
    )
    sd[f"{p}.mlp.experts.down_proj"] = _normal(spec, f"{p}.mlp.experts.down_proj", (e, d, f), 1.0 / np.sqrt(f))
    if spec.n_ff_shexp:
        s = spec.n_ff_shexp
        for proj, n_out, n_in in (("gate_proj", s, d), ("up_proj", s, d), ("down_proj", d, s)):
            name = f"{p}.mlp.shared_expert.{proj}.weight"
            sd[name] = _linear(spec, name, n_out, n_in)
        sd[f"{p}.mlp.shared_expert_gate.weight"] = _linear(spec, f"{p}.mlp.shared_expert_gate.weight", 1, d)


def _full_attention(spec: TinySpec, p: str, sd: dict[str, np.ndarray], zero_centered: bool) -> None:
    d, hd = spec.n_embd, spec.head_dim
    # Qwen3.5 attention is output-gated: q_proj yields [query, gate] per head.
    q_rows = spec.n_head * hd * (2 if spec.flavour.gated_attention else 1)
    a = f"{p}.self_attn"
    sd[f"{a}.q_proj.weight"] = _linear(spec, f"{a}.q_proj.weight", q_rows, d)
    sd[f"{a}.k_proj.weight"] = _linear(spec, f"{a}.k_proj.weight", spec.n_head_kv * hd, d)
    sd[f"{a}.v_proj.weight"] = _linear(spec, f"{a}.v_proj.weight", spec.n_head_kv * hd, d)
    sd[f"{a}.o_proj.weight"] = _linear(spec, f"{a}.o_proj.weight", d, spec.n_head * hd)
    sd[f"{a}.q_norm.weight"] = _norm(spec, f"{a}.q_norm.weight", hd, zero_centered)
    sd[f"{a}.k_norm.weight"] = _norm(spec, f"{a}.k_norm.weight", hd, zero_centered)


def _linear_attention(spec: TinySpec, p: str, sd: dict[str, np.ndarray]) -> None:
    lin = spec.linear
    assert lin is not None
    d, a = spec.n_embd, f"{p}.linear_attn"
    sd[f"{a}.in_proj_qkv.weight"] = _linear(spec, f"{a}.in_proj_qkv.weight", lin.conv_dim, d)
    sd[f"{a}.in_proj_z.weight"] = _linear(spec, f"{a}.in_proj_z.weight", lin.value_dim, d)
    sd[f"{a}.in_proj_b.weight"] = _linear(spec, f"{a}.in_proj_b.weight", lin.n_v_heads, d)
    sd[f"{a}.in_proj_a.weight"] = _linear(spec, f"{a}.in_proj_a.weight", lin.n_v_heads, d)
    sd[f"{a}.conv1d.weight"] = _normal(
        spec, f"{a}.conv1d.weight", (lin.conv_dim, 1, lin.conv_kernel), 1.0 / np.sqrt(lin.conv_kernel)
    )
    sd[f"{a}.dt_bias"] = _normal(spec, f"{a}.dt_bias", (lin.n_v_heads,), 0.5) + np.float32(1.0)
    # Decay rates A in [1, 16), as HF's initialiser draws them; stored as log.
    a_val = _rng(spec, f"{a}.A_log").uniform(1.0, 16.0, lin.n_v_heads).astype(np.float32)
    sd[f"{a}.A_log"] = np.log(a_val).astype(np.float32)
    # The gated output norm is a plain RMSNorm (weight, not 1 + weight).
    sd[f"{a}.norm.weight"] = _norm(spec, f"{a}.norm.weight", lin.head_v_dim, zero_centered=False)
    sd[f"{a}.out_proj.weight"] = _linear(spec, f"{a}.out_proj.weight", d, lin.value_dim)


def hf_weights(spec: TinySpec) -> HfWeights:
    """The fixture's weights in HF form (deterministic in ``spec``)."""
    model_type, config = hf_config(spec)
    zero_centered = spec.flavour.zero_centred_norms
    sd: dict[str, np.ndarray] = {}
    sd["model.embed_tokens.weight"] = _normal(
        spec, "model.embed_tokens.weight", (spec.n_vocab, spec.n_embd), _EMBED_STD
    )
    for il in range(spec.n_layer):
        p = f"model.layers.{il}"
        sd[f"{p}.input_layernorm.weight"] = _norm(spec, f"{p}.input_layernorm.weight", spec.n_embd, zero_centered)
        if spec.layer_types[il] == "linear_attention":
            _linear_attention(spec, p, sd)
        else:
            _full_attention(spec, p, sd, zero_centered)
        sd[f"{p}.post_attention_layernorm.weight"] = _norm(
            spec, f"{p}.post_attention_layernorm.weight", spec.n_embd, zero_centered
        )
        _moe_block(spec, p, sd)
    sd["model.norm.weight"] = _norm(spec, "model.norm.weight", spec.n_embd, zero_centered)
    return HfWeights(model_type=model_type, config=config, state_dict=sd)
