"""Speculative prefetch: guess layer l+1's experts from layer l's output, before l+1's router runs.

With the cache off a layer's reads can start only once its router picked its experts, so the
disk idles from the end of layer l's reads to layer l+1's routing node (the down matmul, the
residual, l+1's attention and router). ``RouterGuess`` applies layer l+1's router to layer l's
output ``l_out-<l>``, skipping l+1's attention: the router's input is ``rms_norm(x) * norm_w``,
and the rms scale is one positive number per token, so the ranking of ``W . (h * norm_w)`` is
the ranking of the real logits for ``x = h`` (softmax keeps the order too). The guess is the top
``n_expert_used`` of it. It is only a guess: the streamer reads the experts the router really
picks whatever was guessed (``Streamer.prefetch``), so a wrong guess costs bytes, never output.

The weights are read once, at open, from the GGUF (F32 and F16 as they are, other types through
gguf-py's dequantizer), and kept as float32: n_expert x n_embd x 4 bytes per layer.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from .archs import ArchEntry
from .layout import ModelLayout, TensorInfo, read_header

_BLK_RE = re.compile(r"^blk\.(?P<il>\d+)\.(?P<suffix>.+)$")


class PrefetchError(ValueError):
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
    except NotImplementedError:
        raise PrefetchError(f"{t.name} is {qtype.name}, which bmoe cannot dequantize for the router guess") from None
    return np.asarray(data, dtype=np.float32).reshape(shape)


@dataclass(frozen=True, slots=True)
class RouterGuess:
    """Per streamed layer ``il``: ``weights[il]`` = router rows scaled by the norm, [n_expert, n_embd]."""
    weights: dict[int, np.ndarray]
    n_embd: int
    k: int

    @staticmethod
    def load(layout: ModelLayout, entry: ArchEntry) -> "RouterGuess":
        """Read every streamed layer's router and norm weight; PrefetchError if one is missing."""
        if not entry.can_prefetch:
            raise PrefetchError(f"--prefetch does not know how architecture '{layout.arch}' routes "
                                "(no router in the registry: bmoe-cli --list-archs)")
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
                raise PrefetchError(f"--prefetch needs blk.{il}.{entry.router} and blk.{il}.{entry.router_norm}, "
                                    "which this GGUF lacks")
            router, norm = _as_f32(*found[(il, "router")]), _as_f32(*found[(il, "norm")])
            if router.shape != (layout.n_expert, norm.shape[-1]) or norm.ndim != 1:
                raise PrefetchError(f"blk.{il}: router {list(router.shape)} and norm {list(norm.shape)} do not fit "
                                    f"{layout.n_expert} experts")
            weights[il] = np.ascontiguousarray(router * norm[None, :], dtype=np.float32)
            n_embd = norm.shape[0]
        return RouterGuess(weights, n_embd, layout.n_expert_used)

    def scores(self, il: int, h: np.ndarray) -> np.ndarray:
        """Layer ``il``'s router logits for input ``h`` (up to the positive rms factor)."""
        # einsum's own loop, not BLAS: OpenBLAS would run this gemv on threads that keep spinning
        # after it, next to llama.cpp's compute threads.
        return np.einsum("ij,j->i", self.weights[il], np.asarray(h, dtype=np.float32))

    def guess(self, il: int, h: np.ndarray) -> np.ndarray:
        """The ``k`` experts layer ``il``'s router would pick for ``rms_norm(h)``, ascending."""
        s = self.scores(il, h)
        if self.k >= s.shape[0]:
            return np.arange(s.shape[0], dtype=np.int64)
        return np.sort(np.argpartition(-s, self.k - 1)[:self.k]).astype(np.int64)

    def can_guess(self, il: int) -> bool:
        return il in self.weights
