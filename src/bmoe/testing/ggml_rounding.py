"""Roundings llama.cpp's CPU kernels make by design, as transformers activations for the reference.

A recipe names one in ``HfArch.reference_config`` (e.g. ``{"hidden_activation": GELU_FP16}``) so
the transformers reference computes what llama.cpp computes, instead of the parity bound being
widened to cover the rounding.

ggml's CPU GELU (the plain op and the fused GEGLU alike) does not evaluate the tanh formula per
value: it rounds the input to fp16, looks the result up in a 65536-entry table of fp16 GELU
values, and passes inputs outside (-10, 10) through as 0 or x. That rounding alone moves a tiny
Gemma 4's log-probabilities by ~5e-3.
"""
from __future__ import annotations

GELU_FP16 = "gelu_pytorch_tanh_ggml_fp16"


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


def register() -> None:
    """Make the activations above known to transformers by name (idempotent)."""
    from transformers.activations import ACT2FN  # the name -> class table the models look up

    if GELU_FP16 not in ACT2FN:
        ACT2FN[GELU_FP16] = _gelu_fp16_table_class()
