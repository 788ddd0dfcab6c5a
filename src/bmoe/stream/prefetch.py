"""Speculative prefetch (``--prefetch``): guess layer l+1's experts from layer l's output, before
l+1's router runs. The reasoning and the measurements behind ``GUESS_SHARE`` and ``WIDE_COVER``:
docs/streaming.md, "Speculative prefetch" and "Read-ahead for prefill ubatches".

``RouterGuess`` applies layer l+1's router to ``l_out-<l>`` (the rms scale does not change the
ranking); a wrong guess costs bytes, never output, since the streamer reads what the router really
picks. Its weights are read once at open (F32/F16 as they are, other types through gguf-py's
dequantizer) and kept as float32: n_expert x n_embd x 4 bytes per layer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from bmoe.errors import ConfigError
from bmoe.stream.archs import ArchEntry
from bmoe.stream.layout import ModelLayout, TensorInfo, read_header

_BLK_RE = re.compile(r"^blk\.(?P<il>\d+)\.(?P<suffix>.+)$")
GUESS_SHARE = 0.5  # experts guessed per layer, as a share of n_expert_used (rounded up)
WIDE_COVER = 3.0  # default wide cut: WIDE_COVER * n_expert / n_expert_used tokens (docs/streaming.md)


class PrefetchError(ConfigError):
    """--prefetch cannot work for this model or these settings (refused at startup)."""


def _as_f32(path: Path, t: TensorInfo) -> np.ndarray:
    """The tensor's values as float32, shaped [ne[-1], ..., ne[0]] (numpy order)."""
    with open(path, "rb") as f:
        f.seek(t.offset)
        raw = f.read(t.nbytes)
    if len(raw) != t.nbytes:
        raise PrefetchError(f"{path} ends inside tensor {t.name}")
    shape = tuple(reversed(t.ne))
    qtype = gguf.GGMLQuantizationType(t.ggml_type)
    if qtype == gguf.GGMLQuantizationType.F32:
        return np.frombuffer(raw, dtype="<f4").reshape(shape).copy()
    if qtype == gguf.GGMLQuantizationType.F16:
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)
    try:
        data = gguf.quants.dequantize(np.frombuffer(raw, dtype=np.uint8), qtype)
        return np.asarray(data, dtype=np.float32).reshape(shape)
    except NotImplementedError:
        raise PrefetchError(f"{t.name} is {qtype.name}, which bmoe cannot dequantize for the router guess") from None
    except ValueError as exc:  # rows that do not fill whole blocks: a damaged or odd tensor
        raise PrefetchError(
            f"{path}: tensor {t.name} of shape {list(t.ne)} cannot be read as {qtype.name}: {exc}"
        ) from None


@dataclass(frozen=True, slots=True)
class RouterGuess:
    """Per streamed layer ``il``: ``weights[il]`` = router rows scaled by the norm, [n_expert, n_embd].
    ``k`` experts are guessed per token; a ubatch of at least ``wide`` tokens guesses every expert."""

    weights: dict[int, np.ndarray]
    n_embd: int
    k: int
    wide: int

    @staticmethod
    def load(layout: ModelLayout, entry: ArchEntry, k: int | None = None, wide: int | None = None) -> "RouterGuess":
        """Read every streamed layer's router and norm weight; PrefetchError if one is missing.
        ``k``: experts guessed per token (default: GUESS_SHARE of n_expert_used, rounded up);
        ``wide``: ubatch width from which every expert is read (default: WIDE_COVER's rule)."""
        if not entry.can_prefetch:
            raise PrefetchError(
                f"--prefetch cannot guess the routing of architecture '{layout.arch}': {entry.why_no_prefetch}"
            )
        want = {entry.router: "router", entry.router_norm: "norm"}
        found: dict[tuple[int, str], tuple[Path, TensorInfo]] = {}
        for f in layout.files:
            for t in read_header(f.path).tensors:
                m = _BLK_RE.match(t.name)
                if m and m["suffix"] in want and int(m["il"]) in layout.layers:
                    found[(int(m["il"]), want[m["suffix"]])] = (f.path, t)
        weights: dict[int, np.ndarray] = {}
        n_embd = 0
        for il in layout.layers:
            if (il, "router") not in found or (il, "norm") not in found:
                raise PrefetchError(
                    f"--prefetch needs blk.{il}.{entry.router} and blk.{il}.{entry.router_norm}, which this GGUF lacks"
                )
            router, norm = _as_f32(*found[(il, "router")]), _as_f32(*found[(il, "norm")])
            if norm.ndim != 1 or router.shape != (layout.n_expert, norm.shape[0]):
                raise PrefetchError(
                    f"blk.{il}: router {list(router.shape)} and norm {list(norm.shape)} do not fit "
                    f"{layout.n_expert} experts"
                )
            weights[il] = np.ascontiguousarray(router * norm[None, :], dtype=np.float32)
            n_embd = norm.shape[0]
        if k is None:
            k = math.ceil(GUESS_SHARE * layout.n_expert_used)
        if not wide:
            wide = wide_cut(layout.n_expert, layout.n_expert_used)
        return RouterGuess(weights, n_embd, max(1, min(k, layout.n_expert)), max(2, wide))

    def scores(self, il: int, h: np.ndarray) -> np.ndarray:
        """Layer ``il``'s router logits for input ``h`` (up to the positive rms factor per token):
        [n_expert] for one row ``h`` [n_embd], [n_tokens, n_expert] for rows [n_tokens, n_embd]."""
        # einsum's own loop, not BLAS: OpenBLAS would run this product on threads that keep
        # spinning after it, next to llama.cpp's compute threads.
        h = np.asarray(h, dtype=np.float32)
        if h.ndim == 1:
            return np.einsum("ij,j->i", self.weights[il], h)
        return np.einsum("ij,tj->ti", self.weights[il], h)

    def guess(self, il: int, h: np.ndarray) -> np.ndarray:
        """The experts to read ahead for layer ``il``, ascending: for one token (``h`` [n_embd] or
        [1, n_embd]) the ``k`` its router scores highest for ``rms_norm(h)``; for a ubatch the union
        of each token's ``k``, or every expert once it has at least ``wide`` tokens."""
        n_expert = self.weights[il].shape[0]
        n_tokens = 1 if np.ndim(h) == 1 else int(np.shape(h)[0])
        if self.k >= n_expert or n_tokens >= self.wide:
            return np.arange(n_expert, dtype=np.int64)
        s = self.scores(il, h).reshape(n_tokens, n_expert)
        top = np.argpartition(-s, self.k - 1, axis=1)[:, : self.k]
        return np.unique(top).astype(np.int64)

    def can_guess(self, il: int) -> bool:
        return il in self.weights


def wide_cut(n_expert: int, n_expert_used: int) -> int:
    """The default ubatch width from which read-ahead reads every expert of the next layer."""
    return max(2, math.ceil(WIDE_COVER * n_expert / n_expert_used))
