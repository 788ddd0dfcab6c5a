"""Numeric helpers shared by the engine, decide and the gates.

Only bookkeeping lives here; every matmul runs in llama.cpp. There is exactly one
log-softmax in the project so that perplexity and decide can be compared bit for bit, and one
token-prefix comparison, which the KV reuse and the decide prefix cache both rely on.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids ``a`` and ``b`` share.

    Runs on every prompt (thousands of ids for an agent's history), so the scan is vectorised.
    """
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.fromiter(a[:n], dtype=np.int64, count=n)
    y = np.fromiter(b[:n], dtype=np.int64, count=n)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def draw_choice(logp: Sequence[float], temperature: float, top_p: float | None, seed: int | None) -> int:
    """A choice drawn from softmax(logp / temperature), within the smallest set of the likeliest
    choices whose probability reaches ``top_p`` (ties kept in order); seeded by ``seed``. The
    finite-set answers and the tool-name decision both draw so (docs/decide.md)."""
    z = np.asarray(logp, dtype=np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    if top_p is not None and top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p[order]), top_p - 1e-12)) + 1
        order = order[: max(1, keep)]
    q = p[order] / p[order].sum()
    pick = np.random.default_rng(seed).choice(len(order), p=q)
    return int(order[pick]) if np.isfinite(q[pick]) else int(order[0])
