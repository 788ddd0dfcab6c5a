"""The KV size of one sequence, read from the model file's header (bmoe.runtime.footprint)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from bmoe.errors import ConfigError
from bmoe.runtime.footprint import kv_bytes_per_sequence


def _header(path: Path, keys: dict[str, int | list[int]]) -> Path:
    w = gguf.GGUFWriter(str(path), "laguna")
    for k, v in keys.items():
        if isinstance(v, list):
            w.add_array(f"laguna.{k}", v)
        else:
            w.add_uint32(f"laguna.{k}", v)
    w.add_tensor("token_embd.weight", np.zeros((4, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_query_heads_per_layer_need_no_scalar_count(tmp_path: Path) -> None:
    # laguna writes its query heads as a per-layer array (more on sliding-window layers); with the
    # KV heads and head sizes it gives, the query heads do not enter the formula.
    model = _header(
        tmp_path / "a.gguf",
        {
            "block_count": 3,
            "embedding_length": 64,
            "attention.head_count": [4, 8, 8],
            "attention.head_count_kv": 2,
            "attention.key_length": 16,
            "attention.value_length": 16,
        },
    )
    assert kv_bytes_per_sequence(model, 512, False) == 512 * 3 * 2 * (16 + 16) * 2


def test_without_head_sizes_the_widest_layer_gives_them(tmp_path: Path) -> None:
    model = _header(
        tmp_path / "a.gguf",
        {"block_count": 3, "embedding_length": 64, "attention.head_count": [4, 8, 8], "attention.head_count_kv": 2},
    )
    assert kv_bytes_per_sequence(model, 512, False) == 512 * 3 * 2 * (8 + 8) * 2  # 64 / 8 heads


def test_without_any_head_count_the_size_is_unknown(tmp_path: Path) -> None:
    model = _header(tmp_path / "a.gguf", {"block_count": 3, "embedding_length": 64})
    with pytest.raises(ConfigError, match="so its KV size is unknown"):
        kv_bytes_per_sequence(model, 512, False)


def test_scalar_heads_give_the_head_size(tmp_path: Path) -> None:
    model = _header(tmp_path / "a.gguf", {"block_count": 2, "embedding_length": 64, "attention.head_count": 4})
    assert kv_bytes_per_sequence(model, 128, True) == 128 * 2 * 4 * (16 + 16) * 4
