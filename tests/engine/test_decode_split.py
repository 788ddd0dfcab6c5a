"""The per-token split of a request (BMOE_DONE's *_s_tok, the one-shot summary) covers its decode
steps only: the prefill's reads and waits are the request's, not any token's."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe.config import SessionConfig
from bmoe.runtime.results import GenerateRequest
from bmoe.session import Session
from bmoe.wire.records import done_fields, summary


def test_the_decode_split_is_the_sum_of_the_steps_and_leaves_the_prefill_out(tiny_models, tmp_path: Path) -> None:
    model = tiny_models("qwen3moe", "q8_0")
    cfg = SessionConfig(model=model, moe_stream=True, twin_dir=tmp_path / "twins", n_ctx=256, n_threads=1)
    with Session(cfg) as s:
        steps = []
        r = s.generate(
            GenerateRequest(prompt="Tell me about the sea and the sky. " * 6, n_predict=6), on_step=steps.append
        )
    dec, io = r.decode_io, r.io
    assert r.n_tokens == len(steps) > 0
    # every expert byte read in a decode step is in the decode part, and only those
    assert sum(st.read_mb for st in steps) == pytest.approx(dec.read_bytes / 1e6)
    assert sum(st.stall_ms for st in steps) == pytest.approx(dec.stall_s * 1e3)
    assert sum(st.io_ms for st in steps) == pytest.approx(dec.io_s * 1e3)
    # the prefill read too, and is in the request's counters but not in the decode part
    assert io.read_bytes > dec.read_bytes > 0 and io.routed > dec.routed
    n = r.n_tokens
    out = done_fields(r)
    assert out["stall_s_tok"] == pytest.approx(dec.stall_s / n, abs=1e-6)
    assert out["io_s_tok"] == pytest.approx(dec.io_s / n, abs=1e-6)
    assert out["compute_s_tok"] == pytest.approx(max(0.0, r.decode_s / n - (dec.io_s + dec.mgmt_s) / n), abs=1e-6)
    for st in steps:  # the protocol's residual, token by token
        assert st.compute_ms == pytest.approx(max(0.0, st.wall_ms - st.io_ms - st.mgmt_ms))
    assert out["read_mib"] == pytest.approx(io.read_bytes / 2**20, abs=1e-3)  # the whole request's
    # the parts of a decode token add up to at most its wall time
    assert out["stall_s_tok"] + out["mgmt_s_tok"] <= r.decode_s / n + 1e-6
    assert f"waiting for flash {dec.stall_s / n * 1e3:.2f} ms" in summary(r)
