"""Numeric helpers shared by perplexity(), decide and the gates.

Only bookkeeping lives here; every matmul runs in llama.cpp. There is exactly one
log-softmax in the project so that perplexity and decide can be compared bit for bit.
"""
from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-softmax over the last axis, computed in float64.

    ``logits  # [..., n_vocab]`` float32 as llama.cpp returns them.
    """
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    shifted = x - m
    lse = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    return shifted - lse
