"""Roundings llama.cpp's CPU kernels make by design, as transformers activations for the reference.

A recipe names one in ``Recipe.reference_config`` (e.g. ``{"hidden_activation": GELU_FP16}``) so
the transformers reference computes what llama.cpp computes, instead of the parity bound being
widened to cover the rounding.

ggml's CPU GELU (the plain op and the fused GEGLU alike) does not evaluate the tanh formula per
value: it rounds the input to fp16, looks the result up in a 65536-entry table of fp16 GELU
values, and passes inputs outside (-10, 10) through as 0 or x. That rounding alone moves a tiny
Gemma 4's log-probabilities by ~5e-3.

ggml's CPU matmul with MXFP4 weights (ggml_vec_dot_mxfp4_q8_0, vec_dot_type Q8_0) first quantizes
its activations to Q8_0: per 32 values, d = amax / 127 stored as fp16, each value round(x / d). So
an MXFP4 expert computes on its input rounded so, and its down projection on the SwiGLU output
rounded so; with the weights themselves exact (on the MXFP4 grid), that rounding is the whole
difference, 2e-2 to 0.9 on a tiny DeepSeek-V4 (it flips routing and indexer picks). EXPERTS_Q8_0
is a transformers experts implementation that rounds both matmuls' inputs the same way.
"""

from __future__ import annotations

GELU_FP16 = "gelu_pytorch_tanh_ggml_fp16"
# A recipe's reference_config {"_experts_implementation": EXPERTS_Q8_0}.
EXPERTS_Q8_0 = "ggml_q8_0_inputs"


def _gelu_fp16_table_class():
    import torch
    from torch import nn

    class GeluFp16Table(nn.Module):
        """tanh-approximated GELU through ggml's fp16 table: fp16(gelu(fp16(x))) inside (-10, 10)."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x16 = x.to(torch.float16).to(torch.float32)
            y = nn.functional.gelu(x16, approximate="tanh").to(torch.float16).to(x.dtype)
            return torch.where(x <= -10.0, torch.zeros_like(x), torch.where(x >= 10.0, x, y))

    return GeluFp16Table


def q8_0_round(x):
    """``x`` through ggml's Q8_0 quantization of its last dim (whole 32-value blocks) and back."""
    import torch

    g = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    d = g.abs().amax(dim=-1, keepdim=True) / 127.0
    q = torch.round(g * torch.where(d > 0, 1.0 / d, torch.zeros_like(d)))
    return (q * d.to(torch.float16).to(x.dtype)).reshape(x.shape)


def _experts_q8_0(self, hidden_states, top_k_index, top_k_weights):
    """transformers' eager experts loop (concatenated [gate; up], untransposed, no biases) with
    both matmuls' inputs through q8_0_round, as llama.cpp's MXFP4 experts compute them."""
    import torch
    from torch.nn import functional as F

    if self.is_transposed or self.has_bias or not self.is_concatenated:
        raise NotImplementedError(f"{EXPERTS_Q8_0} covers [gate; up] experts without biases only")
    out = torch.zeros_like(hidden_states)
    for e in top_k_index.unique().tolist():
        if e >= self.num_experts:
            continue
        tok, pos = torch.where(top_k_index == e)
        h = self._apply_gate(F.linear(q8_0_round(hidden_states[tok]), self.gate_up_proj[e]))
        h = F.linear(q8_0_round(h), self.down_proj[e]) * top_k_weights[tok, pos, None]
        out.index_add_(0, tok, h.to(out.dtype))
    return out


def register() -> None:
    """Make the activations and experts implementation above known to transformers by name
    (idempotent)."""
    from transformers.activations import ACT2FN  # the name -> class table the models look up
    from transformers.integrations.moe import ExpertsInterface

    if GELU_FP16 not in ACT2FN:
        ACT2FN[GELU_FP16] = _gelu_fp16_table_class()
    ExpertsInterface.register(EXPERTS_Q8_0, _experts_q8_0)
