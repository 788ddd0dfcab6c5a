"""HF-form tiny weights -> GGUF tensors, by the rules of llama.cpp's own converter.

Written from the loader's expectations (vendored llama.cpp: ``src/models/qwen3moe.cpp``,
``src/models/qwen35moe.cpp``) and the converter's documented transforms; the reference test
proves the result by comparing llama.cpp's logits with transformers' on the same weights.
Arrays are returned in numpy order, i.e. ggml's ``ne`` reversed (``[out, in]`` for a matmul).
"""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import numpy as np

from bmoe.testing.spec import LinearAttnDims, TinySpec

_T = gguf.MODEL_TENSOR


def tensor_name(kind: gguf.MODEL_TENSOR, il: int | None = None, suffix: str = ".weight") -> str:
    base = gguf.TENSOR_NAMES[kind]
    return (base.format(bid=il) if il is not None else base) + suffix


def _tiled_v_heads(x: np.ndarray, axis: int, lin: LinearAttnDims, head_dim: int) -> np.ndarray:
    """Reorder value heads from HF's grouped order (all V heads of K head 0, then of K head 1...)
    to the tiled order ggml's broadcast expects (V head 0 of every K head, then V head 1...)."""
    per_k = lin.n_v_heads // lin.n_k_heads
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    x = x.reshape(lin.n_k_heads, per_k, head_dim, *rest).swapaxes(0, 1)
    return np.ascontiguousarray(np.moveaxis(x.reshape(-1, *rest), 0, axis))


def _linear_attention(spec: TinySpec, sd: dict[str, np.ndarray], p: str, il: int) -> Iterator[tuple[str, np.ndarray]]:
    lin = spec.linear
    assert lin is not None
    a = f"{p}.linear_attn"
    v = lambda x, axis, hd: _tiled_v_heads(x, axis, lin, hd)  # noqa: E731

    qkv = sd[f"{a}.in_proj_qkv.weight"]
    qk = 2 * lin.key_dim
    yield tensor_name(_T.ATTN_QKV, il), np.concatenate([qkv[:qk], v(qkv[qk:], 0, lin.head_v_dim)])
    yield tensor_name(_T.ATTN_GATE, il), v(sd[f"{a}.in_proj_z.weight"], 0, lin.head_v_dim)
    # conv1d [C, 1, K] -> [C, K]; only its V channels are reordered.
    conv = sd[f"{a}.conv1d.weight"][:, 0, :]
    yield tensor_name(_T.SSM_CONV1D, il), np.concatenate([conv[:qk], v(conv[qk:], 0, lin.head_v_dim)])
    yield tensor_name(_T.SSM_DT, il, ".bias"), v(sd[f"{a}.dt_bias"], 0, 1)
    # llama.cpp multiplies softplus(alpha + dt) by ssm_a directly: it stores A = -exp(A_log).
    yield tensor_name(_T.SSM_A, il, ""), v(-np.exp(sd[f"{a}.A_log"]), 0, 1)
    yield tensor_name(_T.SSM_ALPHA, il), v(sd[f"{a}.in_proj_a.weight"], 0, 1)
    yield tensor_name(_T.SSM_BETA, il), v(sd[f"{a}.in_proj_b.weight"], 0, 1)
    yield tensor_name(_T.SSM_NORM, il), sd[f"{a}.norm.weight"]
    yield tensor_name(_T.SSM_OUT, il), v(sd[f"{a}.out_proj.weight"], 1, lin.head_v_dim)


def _full_attention(sd: dict[str, np.ndarray], p: str, il: int, norm) -> Iterator[tuple[str, np.ndarray]]:
    a = f"{p}.self_attn"
    yield tensor_name(_T.ATTN_Q, il), sd[f"{a}.q_proj.weight"]
    yield tensor_name(_T.ATTN_K, il), sd[f"{a}.k_proj.weight"]
    yield tensor_name(_T.ATTN_V, il), sd[f"{a}.v_proj.weight"]
    yield tensor_name(_T.ATTN_OUT, il), sd[f"{a}.o_proj.weight"]
    yield tensor_name(_T.ATTN_Q_NORM, il), norm(sd[f"{a}.q_norm.weight"])
    yield tensor_name(_T.ATTN_K_NORM, il), norm(sd[f"{a}.k_norm.weight"])


def _moe(spec: TinySpec, sd: dict[str, np.ndarray], p: str, il: int) -> Iterator[tuple[str, np.ndarray]]:
    yield tensor_name(_T.FFN_GATE_INP, il), sd[f"{p}.mlp.gate.weight"]
    gate_up = sd[f"{p}.mlp.experts.gate_up_proj"]  # [n_expert, 2 * n_ff_exp, n_embd]
    f = gate_up.shape[1] // 2
    # Split expert tensors (not the fused gate_up form) so each projection is its own stack.
    yield tensor_name(_T.FFN_GATE_EXP, il), np.ascontiguousarray(gate_up[:, :f, :])
    yield tensor_name(_T.FFN_UP_EXP, il), np.ascontiguousarray(gate_up[:, f:, :])
    yield tensor_name(_T.FFN_DOWN_EXP, il), sd[f"{p}.mlp.experts.down_proj"]  # [n_expert, n_embd, n_ff_exp]
    if spec.n_ff_shexp:
        s = f"{p}.mlp.shared_expert"
        # [1, n_embd] -> [n_embd]: the loader wants a vector.
        yield tensor_name(_T.FFN_GATE_INP_SHEXP, il), sd[f"{p}.mlp.shared_expert_gate.weight"].reshape(-1)
        yield tensor_name(_T.FFN_GATE_SHEXP, il), sd[f"{s}.gate_proj.weight"]
        yield tensor_name(_T.FFN_UP_SHEXP, il), sd[f"{s}.up_proj.weight"]
        yield tensor_name(_T.FFN_DOWN_SHEXP, il), sd[f"{s}.down_proj.weight"]


def gguf_tensors(spec: TinySpec, sd: dict[str, np.ndarray]) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) in file order. The output head is tied to token_embd, so no
    ``output.weight`` is written (llama.cpp then duplicates the embedding)."""
    # Zero-centred RMSNorms compute x * (1 + w); llama.cpp computes x * w, so the converter adds 1.
    if spec.flavour.zero_centred_norms:
        norm = lambda w: w + np.float32(1.0)  # noqa: E731
    else:
        norm = lambda w: w  # noqa: E731
    yield tensor_name(_T.TOKEN_EMBD), sd["model.embed_tokens.weight"]
    yield tensor_name(_T.OUTPUT_NORM), norm(sd["model.norm.weight"])
    for il in range(spec.n_layer):
        p = f"model.layers.{il}"
        yield tensor_name(_T.ATTN_NORM, il), norm(sd[f"{p}.input_layernorm.weight"])
        if spec.layer_types[il] == "linear_attention":
            yield from _linear_attention(spec, sd, p, il)
        else:
            yield from _full_attention(sd, p, il, norm)
        yield tensor_name(spec.flavour.post_attention_norm, il), norm(sd[f"{p}.post_attention_layernorm.weight"])
        yield from _moe(spec, sd, p, il)


# Tensors llama.cpp's converter keeps in F32 whatever the output type (besides vectors and norms).
_KEEP_F32 = frozenset(
    gguf.TENSOR_NAMES[k].rsplit(".", 1)[-1] for k in (_T.FFN_GATE_INP, _T.FFN_GATE_INP_SHEXP, _T.SSM_CONV1D)
)


def storage_type(name: str, data: np.ndarray, quant: str) -> gguf.GGMLQuantizationType:
    """The type the converter would pick for ``name`` in an ``f32`` or ``q8_0`` file."""
    f32 = gguf.GGMLQuantizationType.F32
    if quant == "f32" or data.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return f32
    if name.split(".")[-2] in _KEEP_F32:
        return f32
    if quant == "q8_0":
        return gguf.GGMLQuantizationType.Q8_0
    raise ValueError(f"gguf writes only f32 and q8_0 directly, not {quant!r}")
