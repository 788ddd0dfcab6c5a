"""Token lists decoded side by side on a context's side sequences, each on its own copy of a base:
seq 0's state (``llama_memory_seq_cp``) or a saved state loaded into the side sequence.

How several go into one ``llama_decode`` (``pack_calls``): every list must be computed in one
piece, as it would be alone. llama.cpp cuts a call of several sequences into ubatches that take as
many tokens from each sequence (``split_equal``; with ``kv_unified`` off every multi-sequence call
is split so), so lists of different lengths in one call would be computed in other pieces than
alone, and a piece of another width can take another kernel (``width_class``), which rounds
differently (issue 31: 0.13 nats on a row of the arithmetic set). Two ways keep one piece each:

* padded (``pad``; full scoring, and batched decisions on a streamed model): each call's lists are
  padded after their last token to the longest of them and together fill at most one ubatch, so
  the call is one graph (streamed, every routed expert is read once for all of them). The pad
  tokens come after the tokens whose logits are read, so by causality they change nothing before
  them, and they are dropped with the side sequence. Padding must not move a list into another
  kernel, so lists of different width classes go into different calls;
* of one length (batched decisions resident): a call holds lists of the same length only, so
  nothing is padded, which resident would only cost compute (a quarter more tokens on suffixes of
  26-40 tokens).

A list longer than one ubatch goes alone, in ``n_batch`` pieces as ``decode()`` feeds it, and a
one-token list goes alone too (``decode_forks`` pads one to two tokens instead, so that it is
computed as inside any wider piece).

K-quant weights add a bound of their own (``RowLimits``): llama.cpp's tiled K-quant matmul
(ggml-cpu/tiled, ``ggml_tiled_min_batch``) takes a product from 8 rows on, per expert in an MoE
layer, and ``vec_dot`` below that; the two round differently.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from bmoe.llama.context import LlamaContext
from bmoe.stream.layout import read_header, shard_paths

# Query rows per sequence from which ggml's CPU flash attention runs its tiled kernel
# (GGML_FA_TILE_Q): a row rounds differently there than in the one-row-at-a-time kernel below it.
FA_TILE_ROWS = 64


def width_class(n: int) -> int:
    """Which kernels llama.cpp's CPU backend (llama-cpp-python 0.3.36) runs for a sequence that
    has ``n`` tokens in a ubatch: 0 for one token, 1 for 2..63, 2 for 64 and more. A token computes
    the same whatever the width within a class (0.0 measured on SmolLM2 and the tiny Q8_0 models,
    flash attention off and on), and differently across classes:

    * one token: llamafile's GEMM declines a product with one column (``n < 2``), so with flash
      attention off Q*K and softmax*V take ggml's f16 dot product, whose partial sums differ from
      the GEMM's (0.4 in a logit on SmolLM2), and so do F32 and F16 weights' matmuls when the
      ubatch holds one row in all; with it on, one token of one sequence alone splits the KV cells
      over the threads once its KV view has 512 cells, which nothing wider does;
    * 64 and more: flash attention tiles the queries (0.8 in a logit on SmolLM2, 0.26 on the tiny
      qwen3moe).
    """
    return 0 if n == 1 else 1 if n < FA_TILE_ROWS else 2


# The src0 types llama.cpp's tiled matmul takes (ggml-cpu/tiled/tiled.cpp, ggml_tiled_supported),
# and the rows from which it does (ggml_tiled_min_batch): a product with fewer rows takes vec_dot.
T = gguf.GGMLQuantizationType
TILED_TYPES = frozenset(
    {
        T.Q2_K,
        T.Q3_K,
        T.Q4_K,
        T.Q5_K,
        T.Q6_K,
        T.IQ4_XS,
        T.IQ2_XXS,
        T.IQ2_XS,
        T.IQ2_S,
        T.IQ3_XXS,
        T.IQ3_S,
        T.IQ1_S,
        T.IQ1_M,
    }
)
TILED_MIN_ROWS = 8


@dataclass(frozen=True, slots=True)
class RowLimits:
    """Where a model's weights make the number of rows in a call pick the matmul kernel.

    llama.cpp's CPU backend multiplies a weight of a ``TILED_TYPES`` type by the tiled kernel when
    the product has 8 rows or more, by ``vec_dot`` below (the two round differently). A dense
    weight's product has a row per token of the ubatch (the last layer's, and the output head's, a
    row per output); an expert's has a row per token routed to that expert. So:

    * ``dense``: a list of under 8 rows shares a call only with lists whose rows total under 8,
      and a call holds under 8 outputs when a list alone would have under 8;
    * ``experts``: which expert a token goes to is known only once it ran, and an expert that got
      under 8 rows of a list alone can get 8 or more beside other lists. A call holds several
      lists only while its rows total under 8 (then no expert gets 8 in either case).
    """

    dense: bool = False
    experts: bool = False

    def fits(self, rows: Sequence[int], outputs: Sequence[int], call_rows: int) -> bool:
        """Whether lists of ``rows`` (alone) and ``outputs`` rows of logits may share one call of
        ``call_rows`` rows (their padded widths summed) without any taking another kernel."""
        small = call_rows < TILED_MIN_ROWS
        if self.experts and len(rows) > 1 and not small:
            return False
        if self.dense:
            if any(r < TILED_MIN_ROWS for r in rows) and not small:
                return False
            if any(o < TILED_MIN_ROWS for o in outputs) and sum(outputs) >= TILED_MIN_ROWS:
                return False
        return True


NO_LIMITS = RowLimits()


def row_limits(tensors: Iterable[tuple[str, int]], env: dict[str, str] | None = None) -> RowLimits:
    """The limits for a model's ``(name, ggml type)`` tensors: expert matrices (``*_exps.weight``)
    and the other weights apart. None where ``GGML_CPU_TILED_MM=0`` turns the tiled kernel off."""
    flag = (os.environ if env is None else env).get("GGML_CPU_TILED_MM")
    if flag is not None and flag.strip().lstrip("-").isdigit() and int(flag) == 0:
        return NO_LIMITS
    tiled = [name for name, t in tensors if t in TILED_TYPES]
    experts = any(name.endswith("_exps.weight") for name in tiled)
    return RowLimits(dense=any(not name.endswith("_exps.weight") for name in tiled), experts=experts)


def batch_limits(model: str | Path) -> RowLimits:
    """``row_limits`` of a GGUF file's tensors, over all its shards; the strictest limits where the
    header cannot be read (then the batch is exact, only slower)."""
    try:
        return row_limits((t.name, t.ggml_type) for p in shard_paths(Path(model)) for t in read_header(p).tensors)
    except (OSError, ValueError):
        return row_limits((("unknown", T.Q4_K), ("unknown_exps.weight", T.Q4_K)))


def pack_calls(
    lengths: Sequence[int],
    n_ubatch: int,
    n_batch: int,
    *,
    pad: bool = True,
    outputs: Sequence[int] | None = None,
    limits: RowLimits = NO_LIMITS,
) -> list[list[int]]:
    """Split token lists (by index) into llama_decode calls, each list one piece computed as alone.
    ``pad``: a call's lists are of one ``width_class`` and, padded to the longest of them, fill at
    most one ubatch (and one batch). Without: a call's lists all have one length, so nothing is
    padded, and lists of different lengths take different calls. Either way a list longer than
    that goes alone, and so does every one-token list: only alone is it the one row of its ubatch
    (``width_class``). ``outputs``: the rows of logits each list asks for (1 each by default);
    ``limits``: the K-quant bound (``RowLimits``), under which lists of under 8 rows and of 8 or
    more never share a call. Lists keep their order within a call; the calls come in the order of
    their first list."""
    room = min(n_ubatch, n_batch)
    outs = [1] * len(lengths) if outputs is None else list(outputs)
    calls: list[list[int]] = []
    filling: dict[object, tuple[list[int], int]] = {}  # class (or length) -> (its call being filled, its width)
    for i, n in enumerate(lengths):
        key: object = width_class(n) if pad else n
        if limits.dense:
            key = (key, n >= TILED_MIN_ROWS)
        cur, width = filling.get(key, ([], 0))
        w = max(width, n)
        grown = cur + [i]
        if cur and (
            w * len(grown) > room
            or n == 1
            or not limits.fits([lengths[j] for j in grown], [outs[j] for j in grown], w * len(grown))
        ):
            calls.append(cur)
            cur, w = [], n
        cur.append(i)
        filling[key] = (cur, w)
    calls.extend(cur for cur, _ in filling.values())
    return sorted(calls, key=lambda call: call[0])


def decode_forks(
    ctx: LlamaContext,
    lists: Sequence[Sequence[int]],
    n_past: int,
    base: np.ndarray | None = None,
    limits: RowLimits = NO_LIMITS,
) -> list[np.ndarray]:
    """Decode each of ``lists`` at positions ``n_past..`` on a side sequence holding a copy of seq
    0 (``base`` None) or the saved state ``base``; at most ``ctx.n_seq - 1`` per call. Returns the
    logits after every token of each list ``# [len, n_vocab]``, in order; the side sequences are
    empty afterwards, seq 0 untouched."""
    if not lists or any(not t for t in lists) or ctx.n_seq < 2:
        raise ValueError(
            f"decode_forks takes non-empty token lists and side sequences (the context has {ctx.n_seq - 1})"
        )
    out: list[np.ndarray | None] = [None] * len(lists)
    # A one-token list is padded to two: then it is computed as the same token is inside any wider
    # piece (the prompt and the choice prefilled whole, perplexity), and shares calls with the
    # others, where one row alone would take other kernels (width_class).
    widths = [max(2, len(t)) for t in lists]
    calls = pack_calls(widths, ctx.n_ubatch, ctx.n_batch, outputs=[len(t) for t in lists], limits=limits)
    calls = [call[at : at + ctx.n_seq - 1] for call in calls for at in range(0, len(call), ctx.n_seq - 1)]
    for call in calls:
        longest = max(widths[i] for i in call)
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
                ((seq, toks, _, _),) = items
                out[call[0]] = np.concatenate(
                    [
                        ctx.decode_seqs_rows(
                            [(seq, toks[at : at + ctx.n_batch], n_past + at, len(toks[at : at + ctx.n_batch]))]
                        )[0]
                        for at in range(0, len(toks), ctx.n_batch)
                    ]
                )
            else:
                for i, rows in zip(call, ctx.decode_seqs_rows(items)):
                    out[i] = rows
        finally:
            for seq in range(1, len(call) + 1):
                ctx.drop(seq)
    return _all_filled(out)


def _all_filled(out: list[np.ndarray | None]) -> list[np.ndarray]:
    """``out`` once every call has put its rows in (``pack_calls`` places every list in a call)."""
    filled = [rows for rows in out if rows is not None]
    if len(filled) != len(out):
        raise AssertionError("a token list was left out of every call")
    return filled


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
