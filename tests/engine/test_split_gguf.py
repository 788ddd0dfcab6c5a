"""A split GGUF streams from its shards, byte-identical to the single-file model."""

from pathlib import Path

import numpy as np

from bmoe.config import SessionConfig
from bmoe.runtime.results import GenerateRequest
from bmoe.session import Session
from bmoe.stream import read_layout
from bmoe.testing import write_tiny_split

GEN = GenerateRequest(prompt="Hello", n_predict=16, keep_logits=True)


def test_split_gguf_streams_from_its_shards(tiny_models, tmp_path: Path) -> None:
    first = write_tiny_split("qwen3moe", "q8_0", tmp_path / "split", max_tensors=16)
    layout = read_layout(first)
    assert len(layout.files) >= 3
    assert len({t.file_index for t in layout.experts}) >= 2  # experts really live in several shards
    runs = {}
    for name, model, kw in [
        ("single", tiny_models("qwen3moe", "q8_0"), {}),
        ("split", first, {}),
        ("split-streamed", first, {"moe_stream": True, "cache_mb": 1, "cache_force": True}),
    ]:
        with Session(SessionConfig(model=model, n_ctx=128, n_threads=1, twin_dir=tmp_path / "twins", **kw)) as s:
            runs[name] = s.generate(GEN)
            if kw:
                st = s.stream_stats()
                assert st.read_bytes > 0 and st.evictions > 0
    ref = runs["single"]
    for name in ("split", "split-streamed"):
        assert runs[name].tokens == ref.tokens
        assert all(np.array_equal(a, b) for a, b in zip(runs[name].logits, ref.logits, strict=True))
