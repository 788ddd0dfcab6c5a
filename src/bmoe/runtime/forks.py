"""Token lists decoded side by side on a context's side sequences, each on its own copy of a base:
seq 0's state (``llama_memory_seq_cp``) or a saved state loaded into the side sequence.

How several go into one ``llama_decode`` (``pack_calls``): with padding, each call's lists are
padded after their last token to the longest of them and together fill at most one ubatch, so the
call is one graph (on a streamed model every routed expert is read once for all of them) and each
list is computed in one piece, as it would be alone. The pad tokens come after the tokens whose
logits are read, so by causality they change nothing before them, and they are dropped with the
side sequence. A list longer than that goes alone, in ``n_batch`` pieces as ``decode()`` feeds it.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..llama.context import LlamaContext


def pack_calls(lengths: Sequence[int], n_ubatch: int, n_batch: int, *, pad: bool = True) -> list[list[int]]:
    """Split token lists (by index, in order) into llama_decode calls. ``pad``: each call's lists,
    padded to the longest of them, fill at most one ubatch; else a call holds at most one batch of
    tokens. A list longer than that goes alone."""
    calls: list[list[int]] = []
    cur: list[int] = []
    width = total = 0
    for i, n in enumerate(lengths):
        w = max(width, n)
        full = w * (len(cur) + 1) > min(n_ubatch, n_batch) if pad else total + n > n_batch
        if cur and full:
            calls.append(cur)
            cur, w, total = [], n, 0
        cur.append(i)
        width, total = w, total + n
    if cur:
        calls.append(cur)
    return calls


def decode_forks(
    ctx: LlamaContext, lists: Sequence[Sequence[int]], n_past: int, base: np.ndarray | None = None
) -> list[np.ndarray]:
    """Decode each of ``lists`` at positions ``n_past..`` on a side sequence holding a copy of seq
    0 (``base`` None) or the saved state ``base``; at most ``ctx.n_seq - 1`` per call. Returns the
    logits after every token of each list ``# [len, n_vocab]``, in order; the side sequences are
    empty afterwards, seq 0 untouched."""
    if not lists or any(not t for t in lists) or ctx.n_seq < 2:
        raise ValueError(f"decode_forks takes non-empty token lists and side sequences (the context has {ctx.n_seq - 1})")
    out: list[np.ndarray] = []
    calls = pack_calls([len(t) for t in lists], ctx.n_ubatch, ctx.n_batch, pad=True)
    calls = [call[at : at + ctx.n_seq - 1] for call in calls for at in range(0, len(call), ctx.n_seq - 1)]
    for call in calls:
        longest = max(len(lists[i]) for i in call)
        items = []
        try:
            for seq, i in enumerate(call, start=1):
                if base is None:
                    ctx.fork(seq)
                else:
                    ctx.load_side_state(seq, base)
                toks = list(lists[i])
                items.append((seq, toks + [toks[-1]] * (longest - len(toks)), n_past, len(toks)))
            if longest > ctx.n_batch:  # alone in its call: in n_batch pieces
                (seq, toks, _, _), = items
                out.append(np.concatenate([
                    ctx.decode_seqs_rows([(seq, toks[at : at + ctx.n_batch], n_past + at, len(toks[at : at + ctx.n_batch]))])[0]
                    for at in range(0, len(toks), ctx.n_batch)]))
            else:
                out.extend(ctx.decode_seqs_rows(items))
        finally:
            for seq in range(1, len(call) + 1):
                ctx.drop(seq)
    return out


def prefill_apart(ctx: LlamaContext, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Prefill ``tokens`` from position 0 on side sequence 1, in ``n_batch`` pieces as
    ``decode()`` feeds seq 0: the logits after the last token ``# [n_vocab]`` and the side
    sequence's state as a copy ``# [nbytes] uint8``. The side sequence is empty afterwards."""
    if not tokens or ctx.n_seq < 2:
        raise ValueError("prefill_apart takes tokens and a context with a side sequence")
    seq = 1
    ctx.drop(seq)
    try:
        row = None
        for at in range(0, len(tokens), ctx.n_batch):
            piece = list(tokens[at : at + ctx.n_batch])
            row = ctx.decode_seqs([(seq, piece, at, len(piece) - 1)])[0]
        assert row is not None
        return row, ctx.side_state_bytes(seq)
    finally:
        ctx.drop(seq)
