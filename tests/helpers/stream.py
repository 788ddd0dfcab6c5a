from __future__ import annotations

from pathlib import Path

import numpy as np

from bmoe.stream import Streamer
from bmoe.stream.layout import ExpertTensor, FileId, ModelLayout

PROJS = ("ffn_down_exps", "ffn_gate_exps", "ffn_up_exps")


def make_layout(
    tmp_path: Path, n_layer: int = 4, n_expert: int = 8, slice_nbytes: int = 6528, n_used: int = 2, base: int = 1056
) -> tuple[ModelLayout, bytes]:
    """A file of random bytes described as n_layer x 3 stacked expert tensors (unaligned offsets)."""
    size = base + n_layer * 3 * n_expert * slice_nbytes + 4096
    data = np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "experts.bin"
    path.write_bytes(data)
    experts, off = [], base
    for il in range(n_layer):
        for proj in PROJS:
            experts.append(ExpertTensor(f"blk.{il}.{proj}.weight", il, proj, 0, off, n_expert * slice_nbytes, n_expert))
            off += n_expert * slice_nbytes + 32  # GGUF-style gaps keep the offsets unaligned
    layout = ModelLayout("qwen3moe", (FileId.of(path),), tuple(experts), n_expert, n_used, base, off - base)
    return layout, data


def expert_bytes_in_buffer(streamer: Streamer, t: ExpertTensor, e: int) -> bytes:
    b = streamer.binding(t.name)
    assert b is not None
    # Read back through the buffer the tensor is bound to (its mapping's own memoryview).
    cache = streamer.cache
    buf = cache._buffer(t)
    start = b.data_addr - buf.window.addr + e * t.slice_nbytes
    return bytes(buf.window.view[start : start + t.slice_nbytes])
